# SPDX-License-Identifier: Apache-2.0
"""python/README.md's first example with type hints: what mypy sees of gshm.

    python3 examples/typed_host.py [SOCKET]

Creates a host segment, fills it through a NumPy view, reads it back from a
second connection, prints the daemon's status and unlinks the segment.
ctest python_mypy checks this file (and the package) with mypy."""

import sys
from typing import List, Optional

import numpy

import gshm


def share_and_read(socket: Optional[str], name: str) -> float:
    with gshm.Client(socket, name="typed-producer") as c:
        seg: gshm.AnySegment = c.create(name, 1 << 20, location="host", mode=0o640)
        with seg:
            assert isinstance(seg, gshm.HostSegment)
            a: numpy.ndarray = seg.view("float32", (512, 512))
            a[:] = 1.0
        with gshm.Client(socket) as other, other.open(name, "r") as mine:
            assert isinstance(mine, gshm.HostSegment)  # open gives either kind: narrow it
            info: gshm.SegmentInfo = mine.info
            data: bytes = mine.read(0, 16)
            total = float(numpy.frombuffer(mine, numpy.float32).sum())
            print(info.name, info.size, info.location, data.hex())
        st: gshm.StatusInfo = c.status()
        names: List[str] = [s.name for s in c.segments()]
        print("gshmd %s: %d segments %s" % (st.version, st.segments, names))
        c.unlink(name)
    return total


if __name__ == "__main__":
    print(share_and_read(sys.argv[1] if len(sys.argv) > 1 else None, "examples/typed_host"))
