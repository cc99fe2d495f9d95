"""Shared builders for the kernel tests: paged slot allocation and ragged batches."""

from __future__ import annotations

import torch


def allocate_slots(lengths: list[int], page_size: int, num_pages: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Per request, token-level slot ids laid out as SGLang does: whole pages of page_size consecutive slots,
    pages picked at random from the pool (slot 0.. page_size - 1 is left unused, like SGLang's padding slot)."""
    need = sum(-(-n // page_size) for n in lengths)
    assert need < num_pages, (need, num_pages)
    pages = (torch.randperm(num_pages - 1, generator=gen)[:need] + 1).tolist()
    out = []
    for n in lengths:
        k = -(-n // page_size)
        mine, pages = pages[:k], pages[k:]
        slots = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in mine]) if k else torch.zeros(0)
        out.append(slots[:n].to(torch.int64))
    return out


def indptr(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
