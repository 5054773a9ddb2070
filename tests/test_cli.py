"""The simddp command: outputs, JSON shapes and one-line errors with exit code 2 and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simddp.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_simulate_default_scenario_human() -> None:
    r = run("simulate")
    assert r.returncode == 0, r.stderr
    assert "llama2-7b on 16 x dgx-h100-80gb (128 GPUs)" in r.stdout
    for label in ("step time", "exposed comm", "MFU", "scaling efficiency", "tokens/s"):
        assert label in r.stdout


def test_simulate_json_and_trace(tmp_path) -> None:
    trace = tmp_path / "out.json"
    r = run("simulate", "--json", "--trace", str(trace), "--set", "ddp.bucket_cap_mb=100")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s", "samples_per_s",
                "tokens_per_s", "scaling_efficiency", "buckets", "bounds"):
        assert key in data
    assert {"ready_s", "start_s", "end_s", "size_bytes"} <= set(data["buckets"][0])
    assert data["bounds"]["perfect_overlap_s"] <= data["step_time_s"] <= data["bounds"]["no_overlap_s"]
    assert "traceEvents" in json.loads(trace.read_text())


def test_buckets_json_shape() -> None:
    r = run("buckets", "--json", "--set", "model.preset=gpt2", "--set", "ddp.bucket_cap_mb=null")
    assert r.returncode == 0, r.stderr
    buckets = json.loads(r.stdout)["buckets"]
    assert buckets[0]["size_bytes"] >= 1024**2  # 1 MiB first bucket (bf16 lm head is tied: wte last)
    indices = [i for b in buckets for i in b["param_indices"]]
    assert sorted(indices) == list(range(len(indices)))


def test_collective_json_reports_nccl_tests_bandwidths() -> None:
    r = run("collective", "all-reduce", "--bytes", "8GiB", "--cluster", "dgx-a100-80gb", "--num-nodes", "1",
            "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["busbw_bytes_per_s"] == pytest.approx(d["algbw_bytes_per_s"] * 2 * 7 / 8)
    assert d["busbw_bytes_per_s"] / 1e9 == pytest.approx(231.6, rel=0.15)


def test_collective_sweep_table() -> None:
    r = run("collective", "all-gather", "--cluster", "dgx-h100-80gb", "--num-nodes", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") >= 17


def test_presets_lists_everything() -> None:
    r = run("presets", "--json")
    data = json.loads(r.stdout)
    assert {"dgx-a100-80gb", "dgx-h100-80gb", "pcie-a100-80gb", "aws-p4d-24xlarge"} <= set(data["clusters"])
    assert {"gpt2", "bert-large", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
            "gpt3-175b", "resnet50"} <= set(data["models"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("simulate", "missing.yaml"), "missing.yaml: no such file"),
        (("simulate", "--set", "parallelism.dp=3"), "dp(3) * tp(1) * pp(1) = 3 does not match 128 GPUs"),
        (("simulate", "--set", "model.preset=gpt9"), "unknown preset 'gpt9'"),
        (("simulate", "--set", "ddp.bucket_cap_mb=0"), "ddp.bucket_cap_mb: Input should be greater than 0"),
        (("simulate", "--set", "ddp.frobnicate=1"), "ddp.frobnicate: unknown key"),
        (("simulate", "--set", "nodots"), "expected key.path=value"),
        (("collective", "all-reduce", "--bytes", "12Q"), "--bytes '12Q'"),
        (("collective", "all-gather", "--bytes", "1MiB", "--algorithm", "tree"), "tree is an all-reduce"),
        (("collective", "all-reduce", "--bytes", "1MiB", "--algorithm", "nvls", "--protocol", "LL"),
         "nvls runs only the Simple protocol"),
        (("collective", "all-reduce", "--bytes", "8", "--gpus-per-node", "1"), "needs at least 2 ranks"),
    ],
)
def test_errors_are_one_line_exit_2(args, message) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_malformed_yaml(tmp_path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("cluster: {preset: dgx-a100-80gb\n")
    r = run("simulate", str(p))
    assert r.returncode == 2 and "malformed YAML" in r.stderr and "Traceback" not in r.stderr


def test_unknown_flag_is_argparse_error() -> None:
    r = run("simulate", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
    r = run("collective", "all-reduce", "--bytes", "1MiB", "--num-nodes", "0")
    assert r.returncode == 2 and "argument --num-nodes: 0 must be > 0" in r.stderr and "Traceback" not in r.stderr


def test_memory_human_and_json() -> None:
    r = run("memory", "--max-micro-batch")
    assert r.returncode == 0, r.stderr
    for label in ("parameters", "gradients", "optimizer states", "activations", "total", "fits"):
        assert label in r.stdout
    data = json.loads(run("memory", "--json").stdout)["memory"]
    assert data["total_bytes"] <= data["capacity_bytes"] and data["fits"] is True


def test_buckets_follow_the_pipeline_stage_like_the_simulator() -> None:
    args = ("--set", "parallelism.pp=2", "--set", "parallelism.dp=64")
    buckets = json.loads(run("buckets", "--json", *args).stdout)["buckets"]
    sim = json.loads(run("simulate", "--json", *args).stdout)
    assert len(buckets) == len(sim["buckets"])
    assert [b["size_bytes"] for b in buckets] == [b["size_bytes"] for b in sim["buckets"]]
    assert "pipeline stage 0 of 2" in run("buckets", *args).stdout


def test_version_matches_the_package_metadata() -> None:
    import tomllib
    from importlib.metadata import version

    r = run("--version")
    assert r.returncode == 0
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert r.stdout.strip() == f"simddp {expected}" == f"simddp {version('simddp')}"


@pytest.mark.parametrize(("size", "expected"), [("256MB", 256 * 10**6), ("256MiB", 256 * 2**20), ("1048576", 2**20),
                                                ("1Gbit", 125 * 10**6)])
def test_collective_bytes_decimal_vs_binary(size: str, expected: int) -> None:
    r = run("collective", "all-reduce", "--bytes", size, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["size_bytes"] == expected


def test_collective_bytes_refuses_an_ambiguous_prefix() -> None:
    r = run("collective", "all-reduce", "--bytes", "256M")
    assert r.returncode == 2
    assert r.stderr.strip() == ("simddp: error: --bytes '256M': unit 'M' is ambiguous: write 256MB (decimal), "
                                "256MiB (binary) or 256Mbit")


def test_readme_overrides_compose_on_the_default_scenario() -> None:
    """The README's own example: it used to fail because the default scenario pinned dp."""
    r = run("simulate", "--json", "--set", "cluster.num_nodes=64", "--set", "ddp.bucket_cap_mb=100")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["num_gpus"] == 512 and data["dp"] == 512
    assert data["scenario"] == "llama2-7b-zero1-512xH100"


def test_result_names_what_was_simulated_after_overrides() -> None:
    r = run("simulate", "--set", "model.preset=llama3-70b", "--set", "cluster.num_nodes=32", "--set",
            "parallelism.zero_stage=3")
    assert r.returncode == 0, r.stderr
    assert "llama3-70b-zero3-256xH100: llama3-70b on 32 x dgx-h100-80gb (256 GPUs)" in r.stdout
    assert "llama2-7b" not in r.stdout
    r = run("simulate", str(ROOT / "examples/resnet50-pcie.yaml"), "--set", "ddp.bucket_cap_mb=5", "--json")
    assert json.loads(r.stdout)["scenario"] == "resnet50-ddp-pcie (modified: ddp.bucket_cap_mb=5)"


def test_verdict_first_when_the_layout_does_not_fit() -> None:
    args = ("--set", "parallelism.zero_stage=0", "--set", "cluster.gpu.hbm_bytes=40GiB")
    r = run("simulate", *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "DOES NOT FIT: needs 133.8 GiB per GPU, 40.0 GiB available (93.8 GiB over)"
    assert lines[1].startswith("Hypothetical: the figures below are what this layout would cost if it fitted")
    assert "  memory per GPU           133.83 GiB   DOES NOT FIT: 40.00 GiB available, 93.83 GiB over" in r.stdout
    data = json.loads(run("simulate", "--json", *args).stdout)
    assert list(data)[:3] == ["fits", "memory_bytes", "capacity_bytes"]
    assert data["fits"] is False and data["capacity_bytes"] == 40 * 1024**3
    assert data["memory_bytes"] == data["memory"]["total_bytes"]
    assert (data["memory_bytes"] - data["capacity_bytes"]) / 1024**3 == pytest.approx(93.83, abs=0.005)
    r = run("memory", *args)
    assert r.stdout.splitlines()[0] == lines[0]
    assert json.loads(run("memory", "--json", *args).stdout)["fits"] is False


def test_no_verdict_line_when_it_fits() -> None:
    r = run("simulate")
    assert r.stdout.startswith("Scenario   llama2-7b-zero1-128xH100: ")
    memory_line = next(line for line in r.stdout.splitlines() if line.startswith("  memory per GPU"))
    assert "   fits, " in memory_line and "headroom" in memory_line and "DOES NOT FIT" not in r.stdout
    assert json.loads(run("simulate", "--json").stdout)["fits"] is True


@pytest.mark.parametrize("sets", [
    [],  # the default: interference beside the exposed reduction
    ["parallelism.pp=4", "cluster.num_nodes=4", "parallelism.tp=2"],  # bubble, stage imbalance, TP
    ["cluster.host_overhead_s=0.01", "training.grad_clip_norm=1.0"],
])
def test_simulate_text_lines_add_up_to_the_step(sets: list[str]) -> None:
    """Every line of the step's text but the data-parallel comm total (mostly hidden) is a part of the step, and
    they add up to it (interference and stage imbalance were missing: the lines fell 16 ms and 481 ms short)."""
    out = run("simulate", *[a for s in sets for a in ("--set", s)], "--json")
    step = json.loads(out.stdout)
    text = run("simulate", *[a for s in sets for a in ("--set", s)]).stdout.splitlines()
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    values = {}
    for line in text[text.index(next(x for x in text if x.strip().startswith("step time"))):]:
        if not line.strip():
            break
        label, value, unit = line[:25].strip(), *line[25:].split()[:2]
        values[label] = float(value) * scale[unit]
    parts = sum(v for k, v in values.items() if k not in ("step time", "data-parallel comm"))
    assert parts == pytest.approx(step["step_time_s"], rel=2e-3)  # printed to 4-5 digits
    assert values["step time"] == pytest.approx(step["step_time_s"], rel=1e-3)


@pytest.mark.parametrize("implementation", ["torch", "deepspeed"])
def test_buckets_under_zero3_are_the_units_simulate_reduces(implementation: str) -> None:
    """FSDP and DeepSpeed ZeRO-3 reduce-scatter per unit: `buckets` lists those units, as many and as large as
    simulate's reductions (it listed torch DDP's 291 buckets where simulate reduced 129 DeepSpeed buckets)."""
    sets = ["--set", f"ddp.implementation={implementation}", "--set", "parallelism.zero_stage=3"]
    step = json.loads(run("simulate", *sets, "--json").stdout)
    lines = run("buckets", *sets).stdout.splitlines()
    count = int(lines[0].split()[0])
    assert count == len(step["buckets"]) and count == len(lines) - 2
    what = "FSDP units" if implementation == "torch" else "ZeRO-3 reduce buckets"
    assert lines[0].startswith(f"{count} {what}, ")


def test_fit_layout_tells_no_valid_layout_from_none_fits() -> None:
    """On 24 GPUs no layout at pp 1 splits the batch of 512 (dp 24): the answers that keep pp 1 said "none fits"
    beside 96 fitting layouts; they say none is valid. Where valid layouts are too big they still say none fits."""
    out = run("memory", "--fit-layout", "--num-gpus", "24").stdout
    assert "smallest ZeRO stage   none valid on 24 GPUs with tp 1, pp 1, SP off, recompute selective" in out
    assert "none fits" not in out and "smallest pp           ZeRO-1 tp=1 pp=3 dp=8" in out
    big = run("memory", "--fit-layout", "--num-gpus", "16", "--set", "model.preset=llama2-70b").stdout
    assert "smallest ZeRO stage   none fits" in big
