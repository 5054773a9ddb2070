"""Exports: bucket JSON/CSV with parameter names, dtypes and sizes; simulate --csv per-layer and per-bucket tables."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import simddp
from simddp.cli import default_scenario_path
from simddp.exports import BucketParamRow, bucket_export, layer_rows
from simddp.scenario_io import load_scenario
from simddp.workload import build_workload


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simddp.cli", *args], capture_output=True, text=True, timeout=120)


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("sets", [["model.preset=gpt2"], ["ddp.reduce_in_fp32=true", "parallelism.tp=2"],
                                  ["parallelism.pp=2"]])
def test_bucket_json_names_every_parameter_with_dtype_and_size(sets: list[str]) -> None:
    scenario = load_scenario(default_scenario_path(), sets)
    export = bucket_export(scenario)
    workload = build_workload(scenario)
    names = {p.name: p for p in workload.parameters}
    for b in export.buckets:
        assert [p.index for p in b.params] == b.param_indices
        assert sum(p.size_bytes for p in b.params) == b.size_bytes
        for p in b.params:
            assert names[p.name].numel == p.numel and names[p.name].dtype == p.dtype
            assert p.size_bytes == p.numel * (4 if b.dtype == "float32" else 2)
    listed = [p.name for b in export.buckets for p in b.params]
    assert len(listed) == len(set(listed))
    if "ddp.reduce_in_fp32=true" in sets:  # bf16 parameters, reduced in fp32
        assert {b.dtype for b in export.buckets} == {"float32"} and export.buckets[0].params[0].dtype == "bfloat16"


def test_buckets_cli_json_and_csv_agree() -> None:
    data = json.loads(run("buckets", "--json", "--set", "model.preset=gpt2").stdout)
    r = run("buckets", "--csv", "--set", "model.preset=gpt2")
    assert r.returncode == 0, r.stderr
    rows = _csv(r.stdout)
    assert list(rows[0]) == list(BucketParamRow.model_fields)
    assert all(len(b["params"]) == len(b["param_indices"]) for b in data["buckets"])
    assert len(rows) == sum(len(b["params"]) for b in data["buckets"]) == 148  # GPT-2 small: 148 tensors
    first = data["buckets"][0]["params"][0]
    assert rows[0] == {"bucket": "0", "bucket_size_bytes": str(data["buckets"][0]["size_bytes"]),
                       "bucket_dtype": "bfloat16", "param_index": str(first["index"]), "name": "transformer.ln_f.bias",
                       "dtype": "bfloat16", "numel": "768", "size_bytes": "1536"}


@pytest.mark.parametrize("sets, kind", [(["parallelism.zero_stage=3"], "FSDP units"),
                                        (["ddp.implementation=deepspeed", "parallelism.zero_stage=3"],
                                         "ZeRO-3 reduce buckets")])
def test_buckets_under_zero3_are_the_units_simulate_reduces(sets: list[str], kind: str) -> None:
    """A probe found `buckets --json` listing 291 entries (one per parameter) under DeepSpeed ZeRO-3 where the text
    and simulate reduce 129 buckets, and simulate's records saying 0 parameters and algorithm 'reduce-scatter',
    protocol 'unit'. Now the export lists the units simulate reduce-scatters, each with its parameters (every
    parameter once, sizes adding up to the unit's), and simulate's records name their parameters and NCCL's
    algorithm and protocol."""
    scenario = load_scenario(default_scenario_path(), sets)
    export = bucket_export(scenario)
    result = simddp.simulate(scenario)
    assert export.kind == kind
    assert [b.size_bytes for b in export.buckets] == [b.size_bytes for b in result.buckets]
    assert [len(b.params) for b in export.buckets] == [b.num_params for b in result.buckets]
    # Numbered alike (DeepSpeed's were 0, 1, 2, ... in the export and 0, 4, 8, ... in simulate until 2026-11-29)
    assert [b.index for b in export.buckets] == [b.index for b in result.buckets]
    assert all(b.num_params > 0 and b.algorithm in ("ring", "tree", "nvls", "nvls-tree") and b.protocol in
               ("LL", "LL128", "Simple") for b in result.buckets)
    for b in export.buckets:
        assert sum(p.size_bytes for p in b.params) == b.size_bytes
        assert (b.cap_bytes is None) == (kind == "FSDP units")
    listed = sorted(p.index for b in export.buckets for p in b.params)
    assert listed == list(range(len(build_workload(scenario).parameters)))
    text = run("buckets", *[a for s_ in sets for a in ("--set", s_)])
    assert text.stdout.startswith(f"{len(export.buckets)} {kind}") and "list each one's parameters" in text.stdout
    rows = _csv(run("buckets", "--csv", *[a for s_ in sets for a in ("--set", s_)]).stdout)
    assert len({r["bucket"] for r in rows}) == len(export.buckets)


@pytest.mark.parametrize("sets", [[], ["parallelism.tp=8", "training.recompute=full"], ["parallelism.pp=2"],
                                  ["parallelism.zero_stage=3"]])
def test_layer_rows_cover_the_model_and_add_up_to_the_traced_compute(sets: list[str]) -> None:
    scenario = load_scenario(default_scenario_path(), sets)
    result = simddp.simulate(scenario)
    rows = layer_rows(scenario, result)
    stage0 = [r for r in rows if r.stage % scenario.parallelism.pp == 0]
    assert sum(r.num_params for r in stage0) == result.num_params
    if scenario.parallelism.pp == 1 and scenario.parallelism.zero_stage < 3:
        traced = sum(r.fwd_s + r.bwd_s for r in rows if r.fwd_s is not None and r.bwd_s is not None)
        # The layer rows of the traced (last) micro-batch tile its forward and backward exactly.
        timed = [r for r in rows if r.fwd_s is not None and r.bwd_s is not None]
        start = min(r.fwd_start_s for r in timed)
        end = max(r.bwd_start_s + r.bwd_s for r in timed)
        assert traced == pytest.approx(end - start, rel=1e-9)
        assert len(timed) == len(rows)
        used = {int(b) for r in rows for b in r.buckets.split(";") if b}
        assert used == set(range(len(result.buckets)))


def test_simulate_csv_writes_summary_buckets_and_layers(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    r = run("simulate", "--csv", str(out), "--set", "model.preset=gpt2")
    assert r.returncode == 0, r.stderr
    assert f"tables written: {out / 'summary.csv'}" in r.stdout
    result = json.loads(run("simulate", "--json", "--set", "model.preset=gpt2").stdout)
    summary = {row["metric"]: row["value"] for row in _csv((out / "summary.csv").read_text())}
    assert list(summary)[:2] == ["fits", "memory_bytes"]
    assert float(summary["step_time_s"]) == pytest.approx(result["step_time_s"], rel=1e-9)  # trace vs fast engine
    assert summary["scenario"] == "gpt2-zero1-128xH100"
    buckets = _csv((out / "buckets.csv").read_text())
    assert [int(b["size_bytes"]) for b in buckets] == [b["size_bytes"] for b in result["buckets"]]
    assert [float(b["end_s"]) for b in buckets] == pytest.approx([b["end_s"] for b in result["buckets"]], rel=1e-9)
    assert buckets[0]["first_param"] == "transformer.ln_f.bias"
    layers = _csv((out / "layers.csv").read_text())
    assert layers[0]["layer"] == "transformer.wte" and sum(int(r["num_params"]) for r in layers) == result["num_params"]


def test_simulate_csv_into_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    r = run("simulate", "--csv", str(target))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(f"simddp: error: --csv {target}: exists and is not a directory;")
    assert r.stderr.count("\n") == 1 and target.read_text() == ""


SCENARIO = "cluster: {preset: dgx-a100-80gb, num_nodes: 2}\nmodel: {preset: gpt2}\n"


def test_simulate_csv_writes_into_an_existing_directory_never_over_an_input(tmp_path: Path) -> None:
    """Found by a hostile-input probe: README's `simulate --csv step-tables`, run twice, failed the second time
    (the directory existed); and a scenario inside the directory named like a table would have been replaced."""
    out = tmp_path / "tables"
    for _ in range(2):
        r = run("simulate", "--csv", str(out), "--set", "model.preset=gpt2")
        assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["buckets.csv", "layers.csv", "summary.csv"]
    scenario = out / "summary.csv"
    scenario.write_text(SCENARIO)
    r = run("simulate", str(scenario), "--csv", str(out))
    assert r.returncode == 2 and "is also an input of this command" in r.stderr
    assert scenario.read_text() == SCENARIO
    r = run("simulate", "--csv", str(tmp_path / "t2"), "--trace", str(tmp_path / "t2" / "layers.csv"))
    assert r.returncode == 2 and "the same file as" in r.stderr and not (tmp_path / "t2" / "layers.csv").exists()
    r = run("simulate", "--csv", "")
    assert r.returncode == 2 and "empty directory name" in r.stderr


PARAMETER_LIST = """name: t
model:
  parameters:
    - {name: "=HYPERLINK(1)", numel: 10}
    - {name: "+x", numel: 10}
    - {name: "layer.-weight", numel: 10}
cluster: {preset: dgx-h100-80gb, num_nodes: 1}
training: {global_batch_size: 8, micro_batch_size: 1, seq_len: 16}
"""


def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_quoted(tmp_path: Path) -> None:
    """OWASP's CSV-injection advice: a user's name starting with = + - @ opens as text (behind a '), in every CSV
    simddp writes; other names, and negative numbers, are unchanged."""
    from simddp.exports import dicts_to_csv, frame_to_csv

    path = tmp_path / "s.yaml"
    path.write_text(PARAMETER_LIST)
    out = run("buckets", str(path), "--csv")
    assert out.returncode == 0, out.stderr
    assert sorted(r["name"] for r in _csv(out.stdout)) == ["'+x", "'=HYPERLINK(1)", "layer.-weight"]
    assert run("simulate", str(path), "--csv", str(tmp_path / "out")).returncode == 0
    firsts = {r["first_param"] for r in _csv((tmp_path / "out" / "buckets.csv").read_text())}
    assert firsts <= {"'+x", "'=HYPERLINK(1)", "layer.-weight"} and firsts
    assert dicts_to_csv([{"a": -1.5, "b": "@x", "c": None}], ["a", "b", "c"]) == "a,b,c\n-1.5,'@x,\n"
    import pandas as pd

    assert frame_to_csv(pd.DataFrame({"n": ["-x", "y"], "v": [1.0, None]})) == "n,v\n'-x,1.0\ny,\n"


def test_a_name_with_a_newline_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(PARAMETER_LIST.replace('"+x"', '"a\\nb"'))
    out = run("buckets", str(path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0
    assert "model.parameters.1.name: a name is one line: no newlines or tabs" in out.stderr


PIPELINE_OF_TWO_DTYPES = {
    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2, "gpus_per_node": 4},
    "model": {"parameters": [{"name": "fc1.weight", "numel": 100_000_000, "dtype": "float32"},
                             {"name": "fc2.weight", "numel": 200_000_000, "dtype": "bfloat16"}],
              "layers": [{"name": "fc1", "param_indices": [0], "fwd_time_s": 0.0021, "bwd_time_s": 0.0003},
                         {"name": "fc2", "param_indices": [1], "fwd_time_s": 0.0019, "bwd_time_s": 0.0003}]},
    "parallelism": {"pp": 2},
    "training": {"precision": "fp32", "optimizer": "adamw", "micro_batch_size": 64, "seq_len": 1,
                 "global_batch_size": 1024},
    "ddp": {"bucket_cap_mb": 5000}}


def test_simulate_csv_names_the_reported_stages_buckets(tmp_path: Path) -> None:
    # A probe (2026-11-29): the step reports stage 1 (fc2, bfloat16), but buckets.csv named its bucket from stage
    # 0's (fc1.weight, float32). The result says which stage it reports; the CSV and `buckets --stage` read it.
    scenario = simddp.as_scenario(PIPELINE_OF_TWO_DTYPES)
    result = simddp.simulate(scenario, trace=False)
    assert result.reported_stage == 1 and result.reported_rank == "pipeline stage 1 of 2"
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(PIPELINE_OF_TWO_DTYPES))
    assert run("simulate", str(path), "--csv", str(tmp_path / "out")).returncode == 0
    (row,) = _csv((tmp_path / "out" / "buckets.csv").read_text())
    assert (row["first_param"], row["dtype"], row["size_bytes"]) == ("fc2.weight", "bfloat16", "400000000")
    listed = json.loads(run("buckets", str(path), "--stage", "1", "--json").stdout)
    assert [p["name"] for b in listed["buckets"] for p in b["params"]] == ["fc2.weight"]
    bad = run("buckets", str(path), "--stage", "2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "stage(2) must be in 0..1" in bad.stderr


def test_dataparallel_lists_no_ddp_buckets() -> None:
    # DataParallel sums gradients onto GPU 0 by its own means: `buckets` listed 17 DDP buckets and layers.csv
    # pointed at them, while the step has none.
    scenario = load_scenario(default_scenario_path(), ["ddp.wrapper=dataparallel", "parallelism.zero_stage=0",
                                                       "cluster.num_nodes=1", "model.preset=gpt2"])
    result = simddp.simulate(scenario)
    assert result.buckets == [] and bucket_export(scenario).buckets == []
    assert all(r.buckets == "" for r in layer_rows(scenario, result))
    text = run("buckets", "--set", "ddp.wrapper=dataparallel", "--set", "parallelism.zero_stage=0",
               "--set", "cluster.num_nodes=1", "--set", "model.preset=gpt2")
    assert text.returncode == 0 and text.stdout.startswith("no DDP buckets: DataParallel")


def test_deepspeed_reduce_buckets_are_named_for_when_they_go() -> None:
    # A DeepSpeed ZeRO-3 reduce bucket is issued after a module's backward and holds what filled it: the trace
    # called the bucket holding only lm_head.weight "reduce-scatter model.layers.7.mlp.down_proj".
    scenario = load_scenario(default_scenario_path(), ["ddp.implementation=deepspeed", "parallelism.zero_stage=3",
                                                       "model.preset=gpt2", "cluster.num_nodes=2"])
    result = simddp.simulate(scenario)
    assert result.trace is not None
    # on the data-parallel group's one stream, beside the gathers (its own row with a separate group)
    names = [s.name for s in result.trace.spans if s.name.startswith("reduce-scatter")]
    assert names and all(n.startswith("reduce-scatter bucket ") and "'s backward)" in n for n in names)


def test_a_traces_compute_spans_add_up_to_the_compute_with_tensor_parallelism() -> None:
    # With tp 2 and accumulation, the quiet micro-batches' span held their TP waits: the compute stream's kernels
    # summed to 5.9% over compute_time_s and the TP stream showed only the last micro-batch's collectives.
    scenario = load_scenario(default_scenario_path(), ["model.preset=gpt2", "cluster.num_nodes=1",
                                                       "cluster.comm_compute_interference=0", "parallelism.tp=2",
                                                       "parallelism.tp_comm_overlap=none",
                                                       "training.global_batch_size=64"])
    result = simddp.simulate(scenario)
    assert result.trace is not None and result.num_micro_batches > 1
    spans = result.trace.spans
    kernels = sum(s.end_s - s.start_s for s in spans if s.stream == "compute"
                  and not s.name.startswith(("fwd ", "bwd ", "optimizer", "clip")))
    assert kernels == pytest.approx(result.compute_time_s, rel=1e-9)  # recompute included
    assert any(s.stream == "comm tp" and "(no_sync): tensor-parallel collectives" in s.name for s in spans)


def test_sweep_report_has_a_title(tmp_path: Path) -> None:
    out = tmp_path / "s.html"
    assert run("sweep", "--vary", "ddp.bucket_cap_mb=5,25", "--set", "model.preset=gpt2", "--set",
               "cluster.num_nodes=1", "--html", str(out)).returncode == 0
    assert "<title>simddp sweep of" in out.read_text()

