"""The DB's raw rows, as the data files spell them: the pydantic models ``load.py`` checks each row
of a data file with (extra keys forbidden, every row with a ``source``). Imported by the loader on a
cache miss only: a process that reads a checked DB from the cache (``cache.py``) does not make them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    if TYPE_CHECKING:
        # Every row type declares ``source`` itself, as its last field; said here for the type
        # checker only, since a field declared here would move to the front of every row's
        # fields (and of the order pydantic reports a row's problems in).
        source: str


class PypiRow(Row):
    version: str
    python: list[str]
    python_freethreaded: list[str] = []
    pypi_variant: str
    cuda: str
    cuda_pin: str = ""
    cudnn: str
    nccl: str
    wheel: str = ""
    needs_review: list[str] = []
    source: str


class BuildRow(Row):
    """A ``[[build]]`` row of torch_variants.toml: one build of a torch release (its variant) and
    the CUDA, cuDNN, NCCL and arch list it ships."""

    torch: str
    variant: str
    cuda: str
    cudnn: str
    nccl: str
    arch_list: list[str]
    source: str


class ToolkitRow(Row):
    version: str
    driver_strict: str
    driver_compat: str
    archs: list[str]
    estimated: list[str] = []
    source: str


class FamilyRow(Row):
    """The facts a GPU's compute capability fixes: its architecture and driver branches."""

    cc: str
    architecture: str
    chips: str = ""
    min_driver: str = ""
    min_driver_source: str = ""
    max_driver: str = ""
    max_driver_source: str = ""
    driver_note: str = ""
    pypi_torch: bool = True
    torch_note: str = ""
    source: str


class PcieRow(Row):
    """A PCIe generation's data rate per lane and direction, after line encoding."""

    gen: int
    gt_s: float
    gbs_per_lane: float
    source: str


class GpuRow(Row):
    name: str
    aliases: list[str] = []
    line: str
    cc: str
    memory_gib: float | None = None
    bf16_tflops: float | None = None
    tf32_tflops: float | None = None
    mem_bw_gbs: float | None = None
    node_allreduce_busbw_gbs: float | None = None
    node_allreduce_source: str = ""
    host_arch: list[str]
    host_arch_source: str = ""
    source: str
