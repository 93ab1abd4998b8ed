#!/usr/bin/env python3
"""Compare the SASS of two builds, kernel by kernel, names and addresses left out.

    python3 bench/sass/sass_diff.py OLD.o|OLD_BINARY NEW.o|NEW_BINARY [--offsets]

Reads each file's SASS with cuobjdump (PATH, the CUDA toolkit's bin/, or the copy that ships with
triton), strips instruction addresses and encodings, and matches the kernels' bodies as a
multiset: a file move or a rename leaves every body identical, whatever the kernel names became.
--offsets also strips constant-bank offsets (c[0x0][...]), so that a kernel whose parameter
struct only lost or gained fields compares by its code alone. Prints the identical count and the
kernels (demangled) found on one side only; exits 1 when any body differs."""
import collections
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    triton = "lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump"
    for pattern in ("/usr/local/cuda/bin/cuobjdump", os.path.join(sys.prefix, triton),
                    os.path.join(repo, ".venv-test", triton)):
        hits = glob.glob(pattern)
        if hits:
            return hits[0]
    sys.exit("sass_diff: no cuobjdump (PATH, /usr/local/cuda/bin, or triton's copy in .venv-test)")


def kernels(path, offsets):
    out = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True, check=True)
    bodies, name = {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            bodies[name] = []
            continue
        # Instructions only (they carry an address comment): headers of the next archive member
        # or fatbin entry must not join the last kernel's body.
        if name is None or not re.search(r"/\*[0-9a-f]{4,}\*/", line):
            continue
        text = re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", line).strip()
        if offsets:
            text = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][.]", text)
        if text:
            bodies[name].append(text)
    return {n: hashlib.sha1("\n".join(b).encode()).hexdigest() for n, b in bodies.items()}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    offsets = "--offsets" in sys.argv
    old, new = (kernels(p, offsets) for p in args)
    by_old, by_new = collections.Counter(old.values()), collections.Counter(new.values())
    same = sum(min(c, by_new[h]) for h, c in by_old.items())
    only = []
    for tag, side, other in (("only old", old, by_new), ("only new", new, by_old)):
        left = dict(other)
        for n, h in side.items():
            if left.get(h, 0) > 0:
                left[h] -= 1
            else:
                only.append((tag, n))
    names = subprocess.run(["c++filt"], input="\n".join(n for _, n in only), capture_output=True,
                           text=True).stdout.splitlines() if only else []
    print(f"{len(old)} old, {len(new)} new, {same} identical bodies")
    for (tag, _), name in zip(only, names):
        print(f"  {tag}: {name[:200]}")
    return 1 if only else 0


if __name__ == "__main__":
    sys.exit(main())
