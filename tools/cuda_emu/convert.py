#!/usr/bin/env python3
# .cu -> .cpp for the CPU emulation: kernel<<<grid, block, shmem, stream>>>(args)
# becomes emu::launcher(grid, block, shmem, stream).run(kernel, args), and the
# dynamic shared array becomes the launch's shared buffer.
import re, sys, pathlib
src, dst = sys.argv[1], sys.argv[2]
s = pathlib.Path(src).read_text()
# kernel<<<g, b, sh, st>>>(args) -> emu::launcher(g, b, sh, st).run(kernel, args)
s = re.sub(r"([A-Za-z_][\w]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", lambda m: "emu::launcher(%s).run(%s, " % (m.group(2), m.group(1)), s, flags=re.S)
s = re.sub(r"extern __shared__ float (\w+)\[\];", r"float *\1 = (float *)emu::dyn_shared();", s)
pathlib.Path(dst).write_text(s)
