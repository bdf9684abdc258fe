#!/usr/bin/env python3
"""Put a benchmark table into docs/benchmarks.md between its markers.

Usage: write_section.py NAME TABLE_FILE DOC
Replaces what stands between "<!-- NAME:begin -->" and "<!-- NAME:end -->"
in DOC with the contents of TABLE_FILE, writing DOC.tmp and renaming it over
DOC, so an interrupted write leaves DOC whole. Exits 1 naming the markers
when DOC lacks them. Every bench script's --write goes through here.
"""
import os
import sys

name, table_file, doc = sys.argv[1:4]
table = open(table_file).read()
if not table.endswith("\n"):
    table += "\n"
text = open(doc).read()
begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
i, j = text.find(begin), text.find(end)
if i < 0 or j < i:
    sys.exit(f"{name}: {doc} has no {begin.strip()} ... {end} markers")
with open(doc + ".tmp", "w") as f:
    f.write(text[: i + len(begin)] + table + text[j:])
os.replace(doc + ".tmp", doc)
