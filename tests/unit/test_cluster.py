"""`envspec cluster render`: golden files (regenerate with ENVSPEC_REGEN_GOLDEN=1 and review)."""

import os
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
from envspec import cluster  # noqa: E402

GOLDEN = Path(__file__).parent.parent / "data" / "verify" / "golden"
IMAGE = "ghcr.io/acme/envspec/h100-train@sha256:" + "0123456789abcdef" * 4
NCCL_LOCK = "tests/data/verify/golden/train-nccl.lock"  # [runtime] shm_size 32g and NCCL_* env; relative to ROOT
ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "slurm.sbatch": dict(kind="slurm", nnodes=4, gpus_per_node=8, partition="gpu"),
    # the pyxis form, with the lock's NCCL settings: what NVIDIA's clusters run
    "slurm-pyxis-lock.sbatch": dict(
        kind="slurm", nnodes=4, gpus_per_node=8, partition="gpu", lock=NCCL_LOCK
    ),
    "slurm-podman.sbatch": dict(
        kind="slurm", nnodes=2, gpus_per_node=8, container="podman", lock=NCCL_LOCK
    ),
    "slurm-host.sbatch": dict(
        kind="slurm",
        nnodes=2,
        gpus_per_node=0,
        container="none",
        lock=NCCL_LOCK,
        extra_args=("--skip", "torch.compile", "--json-out", "report dir/report.json"),
    ),
    "kubernetes.yaml": dict(kind="kubernetes", nnodes=4, gpus_per_node=8, namespace="ml"),
    "kubernetes-lock.yaml": dict(
        kind="kubernetes", nnodes=4, gpus_per_node=8, namespace="ml", lock=NCCL_LOCK
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    kw = dict(CASES[name])
    text = cluster.render(kw.pop("kind"), cluster.Job(image=IMAGE, **kw))
    path = GOLDEN / name
    if os.environ.get("ENVSPEC_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), (
        f"{path} is missing: regenerate with ENVSPEC_REGEN_GOLDEN=1 and review it"
    )
    assert text == path.read_text()
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_enroot_reference():
    assert cluster.enroot_ref("ghcr.io/a/b", "sha256:x") == "ghcr.io#a/b@sha256:x"
    assert cluster.enroot_ref("localhost:5000/b", "sha256:x") == "localhost:5000#b@sha256:x"
    assert cluster.enroot_ref("library/b", "sha256:x") == "library/b@sha256:x"


@pytest.mark.parametrize("image", ["ghcr.io/a/b:latest", "ghcr.io/a/b@sha256:abc", "b"])
def test_image_must_be_pinned_by_digest(image):
    with pytest.raises(cluster.RenderError, match="not pinned by digest"):
        cluster.render("slurm", cluster.Job(image=image, nnodes=2, gpus_per_node=8))


def test_lock_settings_reach_the_job(monkeypatch):
    monkeypatch.chdir(ROOT)
    text = cluster.render(
        "slurm", cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=8, lock=NCCL_LOCK)
    )
    assert "export NCCL_IB_HCA=mlx5\n" in text and "export NCCL_SOCKET_IFNAME=eth0\n" in text
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n" in text and "PYTHONUNBUFFERED" not in text
    assert "srun --container-image=ghcr.io#acme/envspec/h100-train@sha256:" in text
    podman = cluster.render(
        "slurm",
        cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=8, lock=NCCL_LOCK, container="podman"),
    )
    assert "--shm-size 32g" in podman and "-e NCCL_IB_HCA" in podman
    assert "--shm-size 8g" in cluster.render(
        "slurm",
        cluster.Job(
            image=IMAGE,
            nnodes=2,
            gpus_per_node=8,
            lock=NCCL_LOCK,
            container="podman",
            shm_size="8g",
        ),
    )  # the command line wins
    k8s = cluster.render(
        "kubernetes", cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=8, lock=NCCL_LOCK)
    )
    assert "sizeLimit: 32Gi" in k8s and '- name: NCCL_IB_HCA\n              value: "mlx5"' in k8s


def test_host_mode_needs_a_lock_and_containers_are_for_slurm():
    with pytest.raises(cluster.RenderError, match="needs --lock"):
        cluster.render(
            "slurm", cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=0, container="none")
        )
    with pytest.raises(cluster.RenderError, match="--container is for --slurm"):
        cluster.render(
            "kubernetes", cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=0, container="podman")
        )
    with pytest.raises(cluster.RenderError, match="--lock nope.lock"):
        cluster.render(
            "slurm", cluster.Job(image=IMAGE, nnodes=2, gpus_per_node=0, lock="nope.lock")
        )


def test_a_tag_is_refused_with_a_hint_exit_2(capsys):
    assert (
        cluster.main(
            [
                "render",
                "--slurm",
                "--image",
                "ghcr.io/acme/train:v1",
                "--nnodes",
                "2",
                "--gpus-per-node",
                "8",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'ghcr.io/acme/train:v1' is not pinned by digest" in err
    assert "hint: push the image and use the digest" in err and "skopeo inspect" in err


def test_output_is_written_atomically(tmp_path, monkeypatch):
    out = tmp_path / "job.sbatch"
    out.write_text("the previous job\n")
    seen = []
    real_replace = os.replace

    def watch(src, dst):  # the job appears whole, by one rename of a file written beside it
        seen.append((Path(src).parent, Path(src).read_text()))
        assert out.read_text() == "the previous job\n"
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watch)
    assert (
        cluster.main(
            [
                "render",
                "--slurm",
                "--image",
                IMAGE,
                "--nnodes",
                "2",
                "--gpus-per-node",
                "8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert seen and seen[0][0] == tmp_path and seen[0][1] == out.read_text()
    assert out.read_text().startswith("#!/bin/bash") and sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["job.sbatch"]


def test_cli_main(capsys, tmp_path):
    out = tmp_path / "job.yaml"
    assert (
        cluster.main(
            [
                "render",
                "--kubernetes",
                "--image",
                IMAGE,
                "--nnodes",
                "2",
                "--gpus-per-node",
                "8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "completionMode: Indexed" in out.read_text()
    assert cluster.main(["--slurm", "--image", "x:1", "--nnodes", "2", "--gpus-per-node", "8"]) == 2
    assert "not pinned by digest" in capsys.readouterr().err


def test_templates_use_strict_undefined(tmp_path, monkeypatch):
    (tmp_path / "slurm.sbatch.j2").write_text("{{ nope }}\n")
    monkeypatch.setattr(cluster, "TEMPLATES", tmp_path)
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        cluster.render("slurm", cluster.Job(image=IMAGE, nnodes=1, gpus_per_node=1))
