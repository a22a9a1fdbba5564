"""GPUs as data: the datasheet figures a roofline clock needs, one record per ``--gpu`` name.

Why: the simulator's step time becomes a roofline (``roofline.py``): a step
takes as long as the slower of its arithmetic at the GPU's peak tensor
FLOP/s and its bytes (weights, KV cache) at the GPU's memory bandwidth;
the KV cache fills what the memory capacity leaves; tensor-parallel
all-reduces cross the GPU-to-GPU link and swapped blocks the host link.
Those five figures, with the document they come from, are all a GPU is here.

The approximations, each a choice the roofline builds on:

* **Peaks, not achievable rates.** Every figure is the vendor's theoretical
  peak; no kernel reaches it, so the roofline applies its own efficiency.
* **Dense FLOP/s.** Datasheets print tensor FLOP/s "with sparsity" (2:4
  structured sparsity, marked with an asterisk) beside or instead of the
  dense figure; serving multiplies dense weights, so the dense figure is
  kept: half the sparse one where only that is printed (said at each GPU).
* **Bandwidth per direction.** NVIDIA quotes NVLink and PCIe bandwidth as
  the total of both directions (NVLink 4's "900 GB/s" is 450 GB/s each
  way); a transfer moves one way, so ``link_gb_s`` and ``host_gb_s`` are
  per GPU and per direction: half the quoted total.
* **One board per name.** The SXM/OAM board of each GPU at its standard
  power, as the named datasheet gives it (an H100 PCIe or a B200 in a
  GB200 superchip has other figures and would be another entry).

Units are the datasheets': TFLOP/s (10^12), GB (10^9), TB/s and GB/s
(10^12 and 10^9 bytes a second).
"""

from __future__ import annotations

from dataclasses import dataclass

from blockspace.errors import InvalidArgumentError


@dataclass(frozen=True)
class GPU:
    """One GPU's datasheet figures (see the module docstring for what each means)."""

    name: str  # the --gpu name
    label: str  # the vendor's full name
    bf16_tflops: float  # dense BF16/FP16 tensor TFLOP/s
    fp8_tflops: float | None  # dense FP8 tensor TFLOP/s; None where the GPU has no FP8 (A100)
    memory_gb: float  # HBM/GDDR capacity, GB (10^9), as the datasheet gives it
    memory_tb_s: float  # memory bandwidth, TB/s
    link: str  # the GPU-to-GPU link
    link_gb_s: float  # GPU-to-GPU bandwidth per GPU, per direction, GB/s
    host_link: str  # the link to the host CPU
    host_gb_s: float  # host link bandwidth per direction, GB/s
    source: str  # the document(s) the figures come from: title and URL


_NVIDIA_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet (1758950-r4), "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_NVIDIA_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/"
    "nvidia-tensor-core-gpu-datasheet; dense figures: NVIDIA H100 Tensor Core GPU Architecture "
    "whitepaper, https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
_NVIDIA_H200 = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_B200 = (
    "NVIDIA DGX B200 datasheet (8 GPUs: 1,440 GB, 64 TB/s HBM3e, 72 PFLOPS FP8 with sparsity, "
    "14.4 TB/s NVLink), https://www.nvidia.com/en-us/data-center/dgx-b200/; NVIDIA HGX B200 "
    "specifications (36 PFLOPS FP16/BF16 with sparsity for 8 GPUs), https://www.nvidia.com/en-us/data-center/hgx/; "
    "host link: MLCommons Inference v6.0 system description nebius_b200_n1 (B200-SXM-180GB, PCIe Gen5 x16)"
)
_NVIDIA_L40S = "NVIDIA L40S GPU datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_AMD_MI300X = (
    "AMD Instinct MI300X data sheet, https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/"
    "data-sheets/amd-instinct-mi300x-data-sheet.pdf; AMD ROCm documentation, 'AMD Instinct MI300 series "
    "microarchitecture' (peak TFLOPS table, 5.3 TB/s, seven Infinity Fabric links, PCIe Gen 5 x16 to the host), "
    "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html"
)

_ALL = (
    GPU(
        name="A100-80GB-SXM",
        label="NVIDIA A100 80GB SXM",
        bf16_tflops=312.0,  # datasheet: 312 dense, 624* with sparsity
        fp8_tflops=None,  # Ampere has no FP8 tensor cores
        memory_gb=80.0,  # 80GB HBM2e
        memory_tb_s=2.039,  # 2,039 GB/s
        link="NVLink 3 (600 GB/s)",
        link_gb_s=300.0,  # "NVLink: 600GB/s" is both directions
        host_link="PCIe Gen4 x16",
        host_gb_s=32.0,  # "PCIe Gen4: 64GB/s" is both directions
        source=_NVIDIA_A100,
    ),
    GPU(
        name="H100-SXM",
        label="NVIDIA H100 SXM5 80GB",
        bf16_tflops=989.4,  # datasheet: 1,979* with sparsity; half, unrounded as in the whitepaper
        fp8_tflops=1978.9,  # datasheet: 3,958* with sparsity; half, as in the whitepaper
        memory_gb=80.0,  # 80GB HBM3
        memory_tb_s=3.35,
        link="NVLink 4 (900 GB/s)",
        link_gb_s=450.0,  # "NVLink: 900GB/s" is both directions
        host_link="PCIe Gen5 x16",
        host_gb_s=64.0,  # "PCIe Gen5: 128GB/s" is both directions
        source=_NVIDIA_H100,
    ),
    GPU(
        name="H200",
        label="NVIDIA H200 SXM 141GB",
        bf16_tflops=989.4,  # datasheet: 1,979* with sparsity (the H100's GH100 compute); half
        fp8_tflops=1978.9,  # datasheet: 3,958* with sparsity; half
        memory_gb=141.0,  # 141GB HBM3e
        memory_tb_s=4.8,
        link="NVLink 4 (900 GB/s)",
        link_gb_s=450.0,  # "NVLink: 900GB/s" is both directions
        host_link="PCIe Gen5 x16",
        host_gb_s=64.0,  # "PCIe Gen5: 128GB/s" is both directions
        source=_NVIDIA_H200,
    ),
    GPU(
        name="B200",
        label="NVIDIA B200 SXM 180GB (HGX/DGX B200)",
        bf16_tflops=2250.0,  # HGX B200: 36 PFLOPS* with sparsity for 8 GPUs -> 4.5 each; half
        fp8_tflops=4500.0,  # DGX B200: 72 PFLOPS* with sparsity for 8 GPUs -> 9 each; half
        memory_gb=180.0,  # DGX B200: 1,440 GB for 8 GPUs
        memory_tb_s=8.0,  # DGX B200: 64 TB/s for 8 GPUs
        link="NVLink 5 (1.8 TB/s)",
        link_gb_s=900.0,  # 1.8 TB/s per GPU (14.4 TB/s for 8) is both directions
        # The B200 itself speaks PCIe Gen6, but the HGX/DGX B200 hosts (Xeon) attach it at Gen5 x16
        host_link="PCIe Gen5 x16",
        host_gb_s=64.0,
        source=_NVIDIA_B200,
    ),
    GPU(
        name="L40S",
        label="NVIDIA L40S",
        bf16_tflops=362.05,  # datasheet: 362.05 dense, 733* with sparsity
        fp8_tflops=733.0,  # datasheet: 733 dense, 1,466* with sparsity
        memory_gb=48.0,  # 48GB GDDR6
        memory_tb_s=0.864,  # 864GB/s
        link="PCIe Gen4 x16",  # no NVLink: GPUs talk over PCIe
        link_gb_s=32.0,  # "PCIe Gen4 x16: 64GB/s bidirectional"
        host_link="PCIe Gen4 x16",
        host_gb_s=32.0,
        source=_NVIDIA_L40S,
    ),
    GPU(
        name="MI300X",
        label="AMD Instinct MI300X",
        bf16_tflops=1307.4,  # dense (2,614.9 with structured sparsity)
        fp8_tflops=2614.9,  # dense
        memory_gb=192.0,  # 192 GB HBM3
        memory_tb_s=5.3,
        link="Infinity Fabric (7 links, 896 GB/s)",
        # The data sheet's 128 GB/s peak per link is both directions (16 lanes at 32 Gb/s each way), as the
        # secondary sources quoting it say (448 GB/s aggregate one way); the PDF itself could not be read here
        link_gb_s=448.0,
        host_link="PCIe Gen5 x16",
        host_gb_s=64.0,  # 128 GB/s both directions
        source=_AMD_MI300X,
    ),
)

GPUS: dict[str, GPU] = {gpu.name: gpu for gpu in _ALL}


def gpu_named(name: str) -> GPU:
    """The GPU called ``name`` (any case); ``InvalidArgumentError`` naming
    ``--gpu`` and every choice for a name that is none of them."""
    for gpu in GPUS.values():
        if gpu.name.lower() == name.strip().lower():
            return gpu
    raise InvalidArgumentError(f"--gpu: unknown GPU {name!r}; one of {', '.join(GPUS)}")


__all__ = ["GPU", "GPUS", "gpu_named"]
