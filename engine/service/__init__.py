"""Where the engine and the store meet, for the window and the command line: replies saved as they
stream, the own-copy-rates A/B, the terminal front door and its commands."""
