import json
from types import SimpleNamespace

import pytest

from envspec.verify.multinode import (
    apply_fake,
    compare,
    forwarded_argv,
    node_entry,
    torchrun_argv,
)


def entry(rank, **fp):
    base = {
        "hostname": f"n{rank}",
        "image": "sha256:aa",
        "lock": "sha256:bb",
        "driver": "580.95.05",
        "gpu": "8 x NVIDIA H100 80GB HBM3",
        "nccl_lib": "sha256:cc",
        "torch": "2.14.1",
        "cuda": "13.0",
    }
    base.update(fp)
    return {"rank": rank, "node_rank": rank, "fingerprint": base}


def test_compare_names_the_minority_node():
    es = [entry(0), entry(1), entry(2, driver="570.86.15"), entry(3)]
    fs = {f.check: f for f in compare(es)}
    d = fs["cluster.driver"]
    assert d.status == "fail"
    assert d.observed == "differs on node 2 (n2, rank 2): 570.86.15"
    assert "580.95.05 (as on 3 of 4 ranks)" == d.expected
    assert fs["cluster.nccl_lib"].status == "pass"


def test_compare_without_majority_names_every_node():
    d = {f.check: f for f in compare([entry(0), entry(1, nccl_lib="sha256:dd")])}[
        "cluster.nccl_lib"
    ]
    assert d.status == "fail" and "no majority" in d.observed and "rank 1): sha256:dd" in d.observed


def test_fake_hook_parses_both_forms():
    fp = {"driver": "1"}
    assert apply_fake(fp, {"ENVSPEC_FAKE_FINGERPRINT": "driver=2, gpu=x"}) and fp == {
        "driver": "2",
        "gpu": "x",
    }
    assert apply_fake(fp, {"ENVSPEC_FAKE_FINGERPRINT": '{"driver": 3}'}) and fp["driver"] == "3"
    assert not apply_fake(fp, {})
    one_task = {
        "ENVSPEC_FAKE_FINGERPRINT": "driver=470.00.00",
        "ENVSPEC_FAKE_FINGERPRINT_TASK": "1",
    }
    assert not apply_fake(fp, {**one_task, "SLURM_PROCID": "0"}) and fp["driver"] == "3"
    assert apply_fake(fp, {**one_task, "SLURM_PROCID": "1"}) and fp["driver"] == "470.00.00"


def test_torchrun_argv_passes_rendezvous_and_drops_launch_options():
    argv = [
        "--lock",
        "a.lock",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        "h:29400",
        "--node-rank=1",
        "--level",
        "full",
    ]
    args = SimpleNamespace(
        nnodes=2,
        nproc_per_node=1,
        master_addr=None,
        master_port=29500,
        node_rank=1,
        rdzv_endpoint="h:29400",
        rdzv_backend="c10d",
        rdzv_id="envspec-verify",
    )
    cmd = torchrun_argv(args, argv)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--rdzv-endpoint" in cmd and cmd[cmd.index("--rdzv-endpoint") + 1] == "h:29400"
    tail = cmd[cmd.index("envspec.verify") + 1 :]
    assert tail == ["--lock", "a.lock", "--nnodes", "2", "--level", "full"]
    assert forwarded_argv(["--rdzv-id", "x", "--json"]) == ["--json"]


def test_a_node_whose_exact_gemm_differs_is_named():
    """issue 31, 2: every node computes the same exact GEMM (health.gpu.N.sdc); its digest is compared
    across nodes like the driver, so a node with a GPU that computes wrong bits is named."""
    es = [entry(r, gemm_result="10b6d1ea06cefaec") for r in range(4)]
    es[1]["fingerprint"]["gemm_result"] = (
        "10b6d1ea06cefaec/ffff0000aaaa5555"  # one of its GPUs differs
    )
    d = {f.check: f for f in compare(es)}["cluster.gemm_result"]
    assert d.status == "fail" and "node 1 (n1, rank 1)" in d.observed
    assert {f.check: f for f in compare([entry(0), entry(1)])}[
        "cluster.gemm_result"
    ].status == "pass"  # quick level


def test_a_ranks_gathered_entry_reads_as_it_was_sent():
    sent = {
        "rank": 3,
        "node_rank": 1,
        "local_rank": 1,
        "fingerprint": {"hostname": "n1", "torch": "2.14.1"},
        "test_hook": False,
        "ok": False,
        "failed": ["torch.version"],
    }
    got = node_entry(json.loads(json.dumps(sent, sort_keys=True)))
    assert got == sent
    assert json.dumps(got) == json.dumps(sent, sort_keys=True)  # the report's "nodes", as before
    with pytest.raises(ValueError, match="not its entry"):
        node_entry(["not", "an", "entry"])
