"""ReqToTokenPool: the [request row, position] -> token slot table, shared by all layers.

Rows are handed to running requests; in paged mode the table is filled a page at a time as
pages are assigned, in contiguous mode row r is the linear map r * C + position for good.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    def __init__(self, n_rows: int, max_context: int, device: torch.device | str,
                 linear: bool = False) -> None:
        self.max_context = max_context
        # int32 [R, C]: kernels read it directly; int32 covers 2^31 slots.
        self.table = torch.zeros((n_rows, max_context), dtype=torch.int32, device=device)
        if linear:
            self.table.copy_(torch.arange(n_rows * max_context, dtype=torch.int32)
                             .view(n_rows, max_context))
        self._free = list(range(n_rows - 1, -1, -1))  # stack: row 0 first

    @property
    def n_rows(self) -> int:
        return self.table.shape[0]

    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        self._free.append(row)

    def write_pages(self, row: int, first_page_index: int, pages: list[int],
                    page_size: int) -> None:
        """Point positions [i*P, (i+1)*P) of `row` at page i's slots, for the given pages."""
        if not pages:
            return
        start = first_page_index * page_size
        end = min(start + len(pages) * page_size, self.max_context)
        p = torch.tensor(pages, dtype=torch.int32)
        slots = (p[:, None] * page_size + torch.arange(page_size, dtype=torch.int32)).flatten()
        self.table[row, start:end] = slots[: end - start].to(self.table.device)
