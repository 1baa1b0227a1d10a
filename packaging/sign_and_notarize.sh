#!/usr/bin/env bash
# Sign Lanes.app with a Developer ID, notarise it with Apple, staple the ticket, and wrap it in a
# signed, notarised .dmg: dist/Lanes-<version>-arm64.dmg. macOS only; run `make package` first.
#
# Identities come from the environment (packaging/README.md has the details):
#   LANES_SIGN_IDENTITY   codesign identity, e.g. "Developer ID Application: Jane Doe (ABCDE12345)"
#   LANES_APPLE_ID        Apple ID email used for notarisation
#   LANES_TEAM_ID         Apple Developer team ID, e.g. ABCDE12345
#   LANES_APP_PASSWORD    app-specific password for that Apple ID (appleid.apple.com)
#   LANES_NOTARY_PROFILE  optional: a `xcrun notarytool store-credentials` profile name, used
#                         instead of LANES_APPLE_ID / LANES_TEAM_ID / LANES_APP_PASSWORD
#   LANES_APP             optional: the app to sign (default dist/Lanes.app)
# Nothing is changed until every variable it needs is there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

describe() {
  case "$1" in
    LANES_SIGN_IDENTITY) echo 'codesign identity, e.g. "Developer ID Application: Jane Doe (ABCDE12345)"';;
    LANES_APPLE_ID) echo "Apple ID email for notarisation";;
    LANES_TEAM_ID) echo "Apple Developer team ID, e.g. ABCDE12345";;
    LANES_APP_PASSWORD) echo "app-specific password for that Apple ID";;
  esac
}

required=(LANES_SIGN_IDENTITY)
if [ -z "${LANES_NOTARY_PROFILE:-}" ]; then
  required+=(LANES_APPLE_ID LANES_TEAM_ID LANES_APP_PASSWORD)
fi
missing=()
for var in "${required[@]}"; do
  if [ -z "${!var:-}" ]; then missing+=("$var"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "sign_and_notarize.sh: refusing to run: ${#missing[@]} environment variable(s) not set:" >&2
  for var in "${missing[@]}"; do echo "  $var  ($(describe "$var"))" >&2; done
  if [ -z "${LANES_NOTARY_PROFILE:-}" ]; then
    echo "(Or set LANES_NOTARY_PROFILE to a notarytool keychain profile instead of LANES_APPLE_ID," >&2
    echo " LANES_TEAM_ID and LANES_APP_PASSWORD.) See packaging/README.md." >&2
  fi
  exit 2
fi

if [ "$(uname -s)" != Darwin ]; then
  echo "sign_and_notarize.sh: refusing to run: signing and notarising need macOS (codesign, notarytool, hdiutil)" >&2
  exit 2
fi
for tool in codesign xcrun hdiutil ditto file /usr/libexec/PlistBuddy; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "sign_and_notarize.sh: $tool not found (install the Xcode command line tools: xcode-select --install)" >&2
    exit 2
  fi
done
APP=${LANES_APP:-dist/Lanes.app}
if [ ! -d "$APP/Contents/MacOS" ]; then
  echo "sign_and_notarize.sh: $APP is not an app bundle: run \`make package\` first" >&2
  exit 2
fi

ENTITLEMENTS=packaging/entitlements.plist
VERSION=$(/usr/libexec/PlistBuddy -c "Print :CFBundleShortVersionString" "$APP/Contents/Info.plist")
DMG="dist/Lanes-$VERSION-arm64.dmg"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lanes-sign.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [ -n "${LANES_NOTARY_PROFILE:-}" ]; then
  NOTARY=(--keychain-profile "$LANES_NOTARY_PROFILE")
else
  NOTARY=(--apple-id "$LANES_APPLE_ID" --team-id "$LANES_TEAM_ID" --password "$LANES_APP_PASSWORD")
fi

sign() {  # hardened runtime and a secure timestamp: both required for notarisation
  codesign --force --timestamp --options runtime --sign "$LANES_SIGN_IDENTITY" "$@"
}

notarise() {  # $1: a .zip or .dmg; waits for Apple's verdict and shows the log when it is not Accepted
  local result="$WORK/notary.plist" status id
  echo "== notarising $1 (this takes a few minutes)"
  xcrun notarytool submit "$1" "${NOTARY[@]}" --wait --output-format plist >"$result"
  status=$(/usr/libexec/PlistBuddy -c "Print :status" "$result" 2>/dev/null || echo unknown)
  id=$(/usr/libexec/PlistBuddy -c "Print :id" "$result" 2>/dev/null || echo "")
  if [ "$status" != Accepted ]; then
    echo "sign_and_notarize.sh: notarisation of $1 ended with status '$status'" >&2
    if [ -n "$id" ]; then xcrun notarytool log "$id" "${NOTARY[@]}" >&2 || true; fi
    exit 1
  fi
}

echo "== signing $APP as $LANES_SIGN_IDENTITY"
# Inside out: every Mach-O file outside a framework, then each framework, then the app itself.
count=0
while IFS= read -r -d '' f; do
  case "$f" in *.framework/*) continue;; esac
  if file -b "$f" | grep -q "Mach-O"; then
    sign "$f"
    count=$((count + 1))
  fi
done < <(find "$APP/Contents" -type f ! -path "$APP/Contents/MacOS/*" -print0)
while IFS= read -r -d '' fw; do
  sign "$fw"
  count=$((count + 1))
done < <(find "$APP/Contents" -type d -name "*.framework" -print0)
sign --entitlements "$ENTITLEMENTS" "$APP"
echo "signed $count libraries and frameworks, then the app"
codesign --verify --deep --strict --verbose=2 "$APP"

ditto -c -k --keepParent "$APP" "$WORK/Lanes.zip"
notarise "$WORK/Lanes.zip"
xcrun stapler staple "$APP"

echo "== making $DMG"
mkdir "$WORK/dmg"
ditto "$APP" "$WORK/dmg/Lanes.app"
ln -s /Applications "$WORK/dmg/Applications"
rm -f "$DMG"
hdiutil create -volname "Lanes $VERSION" -srcfolder "$WORK/dmg" -fs HFS+ -format UDZO -ov "$DMG"
codesign --force --timestamp --sign "$LANES_SIGN_IDENTITY" "$DMG"
notarise "$DMG"
xcrun stapler staple "$DMG"

spctl --assess --type execute --verbose=2 "$APP"
spctl --assess --type open --context context:primary-signature --verbose=2 "$DMG"
echo "Done: $DMG ($(du -h "$DMG" | cut -f1)), signed, notarised and stapled"
