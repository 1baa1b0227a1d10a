"""Qt front end of Lanes; the window lands with issue 4; nothing here may be imported by engine/."""
