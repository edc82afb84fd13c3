"""A preallocated KV cache for the decode loop (:func:`grpolab.rollout.engines.decode.sample_completions`).

transformers' ``DynamicCache`` appends each step's keys and values with ``torch.cat``: every decoding step
allocates a new ``[rows, kv_heads, length + 1, head_dim]`` tensor per layer and copies the whole cache into it
(a profile at 1280 rows had ``aten::cat`` at 49% of generation's self time). ``StaticCache`` preallocates, but
has no ``batch_select_indices`` (the loop drops finished rows and expands a group's shared prompt) and attends
over its whole capacity at every step (a longer softmax: other float round-off than the dynamic cache).

:class:`PreallocatedCache` allocates ``[rows, kv_heads, max_cache_len, head_dim]`` per layer once, writes each
step's keys and values in place, and returns the view of the filled part, ``[:rows, :, :length]``: the
attention sees the same values and shapes as with ``DynamicCache`` (only the strides differ), so the loop's
results do not change (tests/rollout/test_kv_cache.py checks the tokens and log-probs bit for bit). Dropping
finished rows moves the rows after the first dropped one up, in place (the same order as ``DynamicCache``:
another batch order would change the float round-off of the forward, measured 2e-6 in the log-probs).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

CACHE_IMPLEMENTATIONS = ("dynamic", "preallocated")


class PreallocatedLayer(CacheLayerMixin):
    """One layer's keys and values in buffers of fixed capacity.

    ``keys`` / ``values``: the buffers, ``[max_batch_size, kv_heads, max_cache_len, head_dim]`` in the dtype
    and on the device of the first ``update`` (allocated then, uninitialised: only written parts are read).
    ``rows`` and ``length``: the filled part.

    Args:
        max_batch_size: most rows the layer holds (>= 1).
        max_cache_len: most positions per row (>= 1): prompt length + max new tokens.

    Raises:
        ValueError: at construction for a capacity < 1; from ``update`` / ``batch_select_indices`` when the
            rows or positions would exceed the capacity, or ``update``'s rows differ from the filled rows.
    """

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, max_batch_size: int, max_cache_len: int):
        super().__init__()
        if max_batch_size < 1 or max_cache_len < 1:
            raise ValueError(f"capacity must be >= 1, got {max_batch_size} rows x {max_cache_len} positions")
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.rows = 0
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the buffers with ``key_states``' heads, head size, dtype and device."""
        self.device = key_states.device
        shape = (self.max_batch_size, key_states.shape[1], self.max_cache_len)
        self.keys = torch.empty(*shape, key_states.shape[-1], dtype=key_states.dtype, device=self.device)
        self.values = torch.empty(*shape, value_states.shape[-1], dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[rows, kv_heads, q, head_dim]`` states after the filled positions.

        Returns:
            The filled keys and values, views ``[rows, kv_heads, length, head_dim]`` of the buffers.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, end = key_states.shape[0], self.length + key_states.shape[-2]
        if self.length and rows != self.rows:
            raise ValueError(f"update with {rows} rows on a cache of {self.rows}")
        _check_capacity(rows, end, self.max_batch_size, self.max_cache_len)
        self.keys[:rows, :, self.length:end].copy_(key_states)
        self.values[:rows, :, self.length:end].copy_(value_states)
        self.rows, self.length = rows, end
        return self.keys[:rows, :, :end], self.values[:rows, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the filled positions plus the query, as ``DynamicLayer``."""
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        """Empty the cache (the buffers are kept)."""
        self.rows = self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (a negative int, as ``DynamicLayer.crop``)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of positions to remove, got {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` ([n] long, any order, repeats allowed: dropping rows or expanding a group)."""
        if self.length:
            self.move_rows(indices, first_moved_row(indices, self.rows, self.max_batch_size))

    def move_rows(self, indices: torch.Tensor, first: int) -> None:
        """:meth:`batch_select_indices` with its :func:`first_moved_row` already computed."""
        move_rows(self.keys, indices, first, self.length)
        move_rows(self.values, indices, first, self.length)
        self.rows = indices.shape[0]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self.rows, device=self.device).repeat_interleave(repeats))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def _check_capacity(rows: int, length: int, max_rows: int, max_length: int) -> None:
    if rows > max_rows or length > max_length:
        raise ValueError(f"{rows} rows x {length} positions exceed the preallocated {max_rows} x {max_length}")


def first_moved_row(indices: torch.Tensor, rows: int, max_rows: int) -> int:
    """The first ``i`` with ``indices[i] != i`` (``len(indices)`` when none): rows before it stay in place.

    Raises:
        ValueError: ``indices`` holds more than ``max_rows`` rows, or an index >= ``rows``.
    """
    n = indices.shape[0]
    if n > max_rows:
        raise ValueError(f"{n} rows exceed the preallocated {max_rows}")
    if n and int(indices.max()) >= rows:
        raise ValueError(f"row index {int(indices.max())} out of the {rows} filled rows")
    moved = (indices != torch.arange(n, device=indices.device)).nonzero()
    return int(moved[0]) if len(moved) else n


def move_rows(buffer: torch.Tensor, indices: torch.Tensor, first: int, length: int) -> None:
    """In place: ``buffer[i, :, :length] = old buffer[indices[i], :, :length]`` for ``i >= first`` (rows before
    ``first`` are not touched). The moved rows are gathered with ``index_select`` (several times faster on CPU
    than advanced indexing, ``buffer[indices]``, which ``DynamicLayer`` uses), then written back.

    Args:
        buffer: [max_rows, heads, max_len, dim]. indices: [n] long. first: from :func:`first_moved_row`.
    """
    n = indices.shape[0]
    if first < n:
        filled = buffer[:, :, :length]
        filled[first:n].copy_(torch.index_select(filled, 0, indices[first:].to(buffer.device)))


class PreallocatedCache(Cache):
    """A ``Cache`` of :class:`PreallocatedLayer` (full attention layers only).

    Args:
        num_layers: the model's decoder layers. max_batch_size, max_cache_len: each layer's capacity.
    """

    def __init__(self, num_layers: int, max_batch_size: int, max_cache_len: int):
        super().__init__(layers=[PreallocatedLayer(max_batch_size, max_cache_len) for _ in range(num_layers)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` ([n] long) in every layer; one check of the indices for all layers. Rows
        before the first one whose index changes are not copied (dropping the last rows copies nothing).

        Raises:
            ValueError: as :func:`first_moved_row`.
        """
        filled = [layer for layer in self.layers if layer.length]
        if filled:
            first = first_moved_row(indices, filled[0].rows, filled[0].max_batch_size)
            for layer in filled:
                layer.move_rows(indices, first)

    @classmethod
    def from_dynamic(cls, cache: Cache, rows: torch.Tensor, max_cache_len: int) -> PreallocatedCache:
        """A preallocated copy of a prefilled ``DynamicCache``'s rows ``rows`` ([B] long; repeats expand a
        shared prompt to its group's rows), with capacity ``B x max_cache_len`` per layer.

        Raises:
            ValueError: a layer is not a filled full-attention ``DynamicLayer`` (sliding window, linear
                attention, shared or empty layers), or ``max_cache_len`` is below the prefilled length.
        """
        batch = rows.shape[0]
        out = cls(len(cache.layers), batch, max_cache_len)
        for i, (src, dst) in enumerate(zip(cache.layers, out.layers)):
            if type(src) is not DynamicLayer or not src.is_initialized or src.keys.numel() == 0:
                raise ValueError(f"layer {i}: a filled full-attention DynamicLayer is needed, got {src!r}")
            keys, values = src.keys, src.values  # [U, kv_heads, P, head_dim]
            dst.lazy_initialization(keys, values)
            length = keys.shape[-2]
            _check_capacity(batch, length, batch, max_cache_len)
            index = rows.to(keys.device)
            dst.keys[:, :, :length].copy_(keys[index])
            dst.values[:, :, :length].copy_(values[index])
            dst.rows, dst.length = batch, length
        return out
