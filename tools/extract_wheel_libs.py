"""Copies the files of a wheel whose names match a pattern into a folder, flat.

    python tools/extract_wheel_libs.py WHEEL PATTERN DEST

`make peers` takes libccl.so.2 from the full oneccl wheel this way (the oneccl-cpu wheels lack
it), without installing that wheel and what it depends on.
"""

import fnmatch
import os
import sys
import zipfile


def main():
    wheel, pattern, dest = sys.argv[1:4]
    os.makedirs(dest, exist_ok=True)
    taken = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = os.path.basename(info.filename)
            if info.is_dir() or not fnmatch.fnmatch(name, pattern):
                continue
            with archive.open(info) as src, open(os.path.join(dest, name), "wb") as out:
                out.write(src.read())
            os.chmod(os.path.join(dest, name), 0o755)
            taken += 1
    if taken == 0:
        sys.exit(f"{wheel}: no file matches {pattern}")


if __name__ == "__main__":
    main()
