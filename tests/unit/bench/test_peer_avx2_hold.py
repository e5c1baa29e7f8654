"""peer_stack_vs_vllm.py --cpu-isa avx2 holds vLLM to the kernel build it
ships for AVX2 CPUs: the sitecustomize it puts on vLLM's PYTHONPATH must
answer torch.cpu's hardware checks as an AVX2 CPU would (and import nothing
early), and the round must be able to say which build vLLM's processes
mapped. Without both, the AVX2 comparison measures vLLM on AVX-512."""

import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from peer_stack_vs_vllm import VLLM_AVX2_SITECUSTOMIZE, vllm_kernel_builds  # noqa: E402


def _run(code: str, site_dir: Path | None) -> str:
    env = {"PATH": "/usr/bin:/bin"}
    if site_dir is not None:
        env["PYTHONPATH"] = str(site_dir)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


CHECKS = """
    import sys
    early = "torch" in sys.modules
    import torch.cpu
    checks = [torch.cpu._is_avx512_supported(), torch.cpu._is_avx512_bf16_supported(),
              torch.cpu._is_vnni_supported(), torch.cpu._is_amx_tile_supported()]
    print(early, any(checks), torch.cpu._is_avx2_supported())
"""


def test_sitecustomize_answers_torch_cpu_as_an_avx2_cpu(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(VLLM_AVX2_SITECUSTOMIZE)
    # torch not imported by the hook itself; no wide check says yes; AVX2 still does
    # (vLLM then loads _C_AVX2).
    assert _run(CHECKS, tmp_path) == f"False False {_run('import torch; print(torch.cpu._is_avx2_supported())', None)}"


def test_without_the_hook_torch_cpu_reports_the_hardware(tmp_path):
    # The same checks unpatched: on an AVX-512 machine at least one is True,
    # which is what the hook exists to hide.
    early, wide, _ = _run(CHECKS, None).split()
    assert early == "False"
    flags = Path("/proc/cpuinfo").read_text()
    assert wide == str(" avx512f" in flags)


def test_kernel_builds_are_read_from_the_processes_maps(tmp_path):
    library = tmp_path / "site-packages" / "vllm" / "_C_AVX2.abi3.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import mmap, sys
            with open({str(library)!r}, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                print("mapped", flush=True)
                sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert "_C_AVX2.abi3.so" in vllm_kernel_builds()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
