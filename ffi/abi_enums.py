"""Writes the C enums of include/clef_tt.h as a Python module (the op package's
clef_tt_ttnn/abi.py), so the header is the one source of their values for C++, Rust (bindgen)
and Python. Run by regenerate-bindings.sh; CI regenerates it and fails on any difference.

Usage: python3 ffi/abi_enums.py HEADER OUT
"""

import re
import sys

ENUM = re.compile(r"typedef enum (clef_tt_\w+) \{(.*?)\} \1;", re.S)
VALUE = re.compile(r"^\s*CLEF_TT_(\w+) = (\d+),", re.M)


def render(header):
    out = [
        '"""The C enums of ffi/include/clef_tt.h (generated from it by ffi/regenerate-bindings.sh,',
        "through ffi/abi_enums.py: never edit by hand). The bridge passes these integers through",
        'unchanged."""',
    ]
    enums = ENUM.findall(header)
    if not enums:
        raise SystemExit("abi_enums.py: no `typedef enum clef_tt_*` in the header")
    for name, body in enums:
        members = VALUE.findall(body)
        if len(members) != len(re.findall(r"^\s*CLEF_TT_", body, re.M)):
            raise SystemExit("abi_enums.py: %s has a member without an explicit value" % name)
        out += ["", "# " + name]
        out += ["%s = %s" % (member, value) for member, value in members]
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    with open(argv[1], encoding="utf-8") as f:
        text = render(f.read())
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main(sys.argv)
