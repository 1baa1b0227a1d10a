#!/usr/bin/env bash
# Install Debian/Ubuntu packages with apt where it can (as root, or with passwordless sudo); otherwise
# say what to run. Never fails the build: what needs the packages says so itself.
#
#   bash scripts/apt-install.sh WHAT PACKAGE...     (WHAT: what they are for, for the messages)
set -uo pipefail
what=$1; shift
if [ "$(id -u)" = 0 ]; then SUDO=
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"
else SUDO=none; fi
echo "Installing $what: $*"
if [ "$SUDO" != none ] && command -v apt-get >/dev/null 2>&1 \
   && $SUDO apt-get update -qq \
   && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
  echo "Installed $what."
else
  echo "WARNING: could not install $what (needs apt, and root or passwordless sudo)." >&2
  echo "WARNING: Fix: sudo apt-get install $*" >&2
fi
