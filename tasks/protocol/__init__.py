"""What every process agrees on: names, message and result formats, Lua scripts."""
