"""A tiny GTP engine for match tests: answers every command, and always wants to play A1."""

import sys

for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "quit":
        print("= \n", flush=True)
        break
    if words[0] == "name":
        print("= stubborn\n", flush=True)
    elif words[0] == "known_command":
        print("= false\n", flush=True)
    elif words[0] == "genmove":
        print("= A1\n", flush=True)
    else:
        print("= \n", flush=True)
