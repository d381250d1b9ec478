#!/usr/bin/python3
"""A command that runs on the CPU loads no GPU runtime (issue 30):

  * `--device cpu` never opens a backend plugin, the Vulkan loader, a
    Vulkan driver, libcuda or LLVM;
  * `--device auto` (the default) on a machine without a GPU device node
    (/dev/nvidiactl, /dev/nvidia0, /dev/dxg, /dev/dri/renderD*) does not
    probe at all: the same nothing, and the backend line says cpu;
  * NEEDLE_GPU_PROBE=0 never probes, even beside a GPU;
  * NEEDLE_GPU_PROBE=1 probes regardless, but a search for a GPU leaves
    software Vulkan drivers (lavapipe) out: libvulkan_lvp.so is never opened
    (a VK_LOADER_DRIVERS_DISABLE of the user's own is kept beside that);
  * `needle run` on a quantised archive loads no GPU runtime either;
  * when a named device does not exist (--device vulkan:99) the error is
    clean, and in sanitizer builds the drivers the Vulkan loader opened stay
    mapped (LeakSanitizer can then name them, tests/lsan_drivers.supp matches
    them: an unloaded driver's leak reads "<unknown module>").

What was loaded is read from the dynamic linker's own trace (LD_DEBUG=files),
so the test depends on glibc; elsewhere it skips (77).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build"))
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
FAIL = []
# what a GPU probe maps: our plugins, the Vulkan loader and drivers (Mesa's
# map LLVM), the NVIDIA driver and CUDA libraries
GPU_LIBS = re.compile(r"libneedle_(cuda|vulkan)\.so|libvulkan|libLLVM|libcuda|libcublas|"
                      r"libnvidia|libVkLayer")


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def traced(tmp, *args, env=None):
    """Runs needle under LD_DEBUG=files: (process, tried, mapped, unmapped),
    the sets of files it asked dlopen for, mapped, and unmapped again."""
    prefix = os.path.join(tmp, "ld")
    for f in glob.glob(prefix + ".*"):
        os.unlink(f)
    e = dict(os.environ)
    e["HF_HUB_OFFLINE"] = "1"
    e.pop("NEEDLE_GPU_PROBE", None)
    e.update(env or {})
    e["LD_DEBUG"] = "files"
    e["LD_DEBUG_OUTPUT"] = prefix
    p = subprocess.run([NEEDLE] + [str(a) for a in args], env=e, capture_output=True,
                       text=True, timeout=600)
    tried, mapped, unmapped = set(), set(), set()
    for path in glob.glob(prefix + ".*"):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r"file=(\S+) \[\d+\];\s+(.*)", line)
                if not m:
                    continue
                name, what = os.path.basename(m.group(1)), m.group(2)
                if what.startswith("dynamically loaded"):
                    tried.add(name)
                elif what.startswith("generating link map"):
                    mapped.add(name)
                elif what.startswith("destroying link map"):
                    unmapped.add(name)
    return p, tried, mapped, unmapped


def gpu(names):
    return sorted(n for n in names if GPU_LIBS.search(n))


def gpu_node():
    return (any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))
            or bool(glob.glob("/dev/dri/renderD*")))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "base.pkl")
        p = subprocess.run([NEEDLE, "init", ck, "--preset", "tiny", "--seed", "3"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print("FAIL init tiny checkpoint " + p.stderr[-300:])
            return 1
        toks = os.path.join(tmp, "t.txt")
        with open(toks, "w") as f:
            f.write("1 2 3 4 5 6 7 8\n")
        ev = ("eval", "--checkpoint", ck, "--tokens", toks)

        p, tried, mapped, _ = traced(tmp, *ev, "--device", "cpu")
        if not mapped:
            print("skip: no LD_DEBUG=files trace (not glibc's dynamic linker?)")
            return 77
        check(p.returncode == 0, "eval --device cpu runs " + p.stderr[-300:])
        check(not gpu(tried | mapped), "eval --device cpu loads no GPU library %s"
              % gpu(tried | mapped))

        p, tried, mapped, _ = traced(tmp, *ev)
        check(p.returncode == 0, "eval (auto) runs " + p.stderr[-300:])
        if gpu_node():
            print("skip: this machine has a GPU device node; auto may load its runtime")
        else:
            check(not gpu(tried | mapped), "no GPU device node: eval (auto) probes nothing %s"
                  % gpu(tried | mapped))
            check(re.search(r"backend +cpu ", p.stderr) is not None,
                  "eval (auto) prints the cpu backend line " + p.stderr[-300:])

        p, tried, mapped, _ = traced(tmp, *ev, env={"NEEDLE_GPU_PROBE": "0"})
        check(p.returncode == 0 and not gpu(tried | mapped),
              "NEEDLE_GPU_PROBE=0: eval (auto) probes nothing %s %s"
              % (gpu(tried | mapped), p.stderr[-200:]))

        p, tried, mapped, _ = traced(tmp, *ev, env={"NEEDLE_GPU_PROBE": "1"})
        check(p.returncode == 0, "NEEDLE_GPU_PROBE=1: eval (auto) runs " + p.stderr[-300:])
        plugin = os.path.exists(os.path.join(BUILD, "libneedle_vulkan.so"))
        if plugin:
            check("libneedle_vulkan.so" in tried,
                  "NEEDLE_GPU_PROBE=1: auto asks for the Vulkan plugin %s" % gpu(tried))
        check(not [n for n in mapped if "libvulkan_lvp" in n],
              "a search for a GPU does not load lavapipe %s" % gpu(mapped))
        # the user's own driver filter still applies beside ours
        p, tried, mapped, _ = traced(tmp, *ev, env={"NEEDLE_GPU_PROBE": "1",
                                                    "VK_LOADER_DRIVERS_DISABLE": "*radeon*"})
        check(p.returncode == 0 and not [n for n in mapped if re.search("lvp|radeon", n)],
              "VK_LOADER_DRIVERS_DISABLE=*radeon* and the search for a GPU: neither radeon nor "
              "lavapipe loaded %s" % gpu(mapped))

        cact = os.path.join(tmp, "m.cact")
        p = subprocess.run([NEEDLE, "build", ck, "--out", cact, "--tokenizer", TOK, "--bits",
                            "4"], capture_output=True, text=True, timeout=600)
        check(p.returncode == 0, "build a tiny archive " + p.stderr[-300:])
        tools = os.path.join(tmp, "tools.json")
        with open(tools, "w") as f:
            f.write('[{"name": "timer", "description": "set a timer", "parameters": '
                    '{"type": "object", "properties": {"minutes": {"type": "integer"}}}}]')
        p, tried, mapped, _ = traced(tmp, "run", "--weights", cact, "--tools", tools,
                                     "--max-new-tokens", "40", "set a timer",
                                     env={"NEEDLE_GPU_PROBE": "1"})
        check(p.returncode == 0 and not gpu(tried | mapped),
              "run on an archive loads no GPU library %s %s"
              % (gpu(tried | mapped), p.stderr[-200:]))

        if plugin:
            p, tried, mapped, unmapped = traced(tmp, *ev, "--device", "vulkan:99")
            check(p.returncode == 1 and "backend 'vulkan'" in p.stderr
                  and "LeakSanitizer" not in p.stderr,
                  "--device vulkan:99: a clean error, exit %d (%s)"
                  % (p.returncode, p.stderr.strip()[-300:]))
            drivers = [n for n in mapped if n.startswith("libvulkan_")]
            if os.environ.get("NEEDLE_SANITIZED") == "1" and drivers:
                gone = gpu(unmapped)
                check(not gone, "sanitizer build: the Vulkan drivers stay mapped %s (unmapped %s)"
                      % (sorted(drivers), gone))

    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
