"""The paged KV cache's bookkeeping: a pool of blocks with reference counts and a prefix cache.

A full block is identified by the hash of its tokens chained to its parent block's hash, so a
hit on block ``i`` implies the whole prefix before it matches. Blocks that no request references
stay in the cache (evictable) until they are reallocated, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict

from reference_engine.request import Request
from reference_engine.stats import KVCacheStats

BlockHash = int


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.cached: dict[BlockHash, int] = {}
        self.req_blocks: dict[str, list[int]] = {}
        self.req_hashes: dict[str, list[BlockHash]] = {}
        self.req_num_registered: dict[str, int] = {}  # leading blocks already offered to the cache
        self.num_cached_free = 0  # free blocks that still hold a prefix-cache entry

    # --- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def stats(self) -> KVCacheStats:
        return KVCacheStats(self.num_blocks, len(self.free), self.num_cached_free, self.block_size)

    def blocks_of(self, request_id: str) -> list[int]:
        return self.req_blocks.get(request_id, [])

    # --- prefix cache ------------------------------------------------------------------------

    def _hashes(self, req: Request) -> list[BlockHash]:
        """Hashes of the request's full blocks, extended incrementally as tokens arrive."""
        hashes = self.req_hashes.setdefault(req.request_id, [])
        tokens, bs = req.all_token_ids, self.block_size
        while (len(hashes) + 1) * bs <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash((parent, tuple(tokens[i * bs : (i + 1) * bs]))))
        return hashes

    def get_computed_blocks(self, req: Request) -> list[int]:
        """The longest cached prefix of ``req``; it always leaves one token to compute."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        max_blocks = (req.num_tokens - 1) // self.block_size
        for h in self._hashes(req)[:max_blocks]:
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def cache_full_blocks(self, req: Request) -> None:
        """Registers the request's blocks that are full of computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        rid = req.request_id
        num_full = req.num_computed_tokens // self.block_size
        done = self.req_num_registered.get(rid, 0)
        if num_full <= done:
            return  # the common decode step: no block became full
        blocks = self.req_blocks.get(rid, [])
        num_full = min(num_full, len(blocks))
        if num_full <= done:
            return
        hashes = self._hashes(req)
        for i in range(done, num_full):
            h, block = hashes[i], blocks[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
        self.req_num_registered[rid] = num_full

    # --- allocation --------------------------------------------------------------------------

    def allocate_slots(
        self, req: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        """Makes room for ``num_new_tokens`` more tokens after the computed ones (and the prefix
        hits in ``computed_blocks``, which it then holds). False, changing nothing, if the pool
        is too small."""
        blocks = self.req_blocks.get(req.request_id)
        if blocks is None:
            blocks = self.req_blocks[req.request_id] = []
        if not computed_blocks:
            needed = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
            if needed <= len(blocks):  # the common decode step: the last block has room
                return True
        computed_blocks = computed_blocks or []
        num_computed = req.num_computed_tokens + len(computed_blocks) * self.block_size
        needed = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = needed - len(blocks) - len(computed_blocks)
        reusable = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if num_new_blocks > len(self.free) - reusable:
            if not blocks:
                del self.req_blocks[req.request_id]
            return False
        for b in computed_blocks:
            if self.ref_counts[b] == 0:
                del self.free[b]
                self.num_cached_free -= 1
            self.ref_counts[b] += 1
        blocks.extend(computed_blocks)
        for _ in range(max(num_new_blocks, 0)):
            blocks.append(self._pop_free())
        return True

    def _pop_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            self.num_cached_free -= 1
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def trim(self, req: Request, num_tokens: int) -> None:
        """Releases the request's blocks past the first ``num_tokens`` tokens (rejected drafts)."""
        blocks = self.req_blocks.get(req.request_id, [])
        keep = -(-num_tokens // self.block_size)
        while len(blocks) > keep:
            self._release(blocks.pop())

    def free_request(self, req: Request) -> None:
        blocks = self.req_blocks.pop(req.request_id, [])
        # Tail blocks first, so they are evicted before the shared prefix blocks.
        for block in reversed(blocks):
            self._release(block)
        self.req_hashes.pop(req.request_id, None)
        self.req_num_registered.pop(req.request_id, None)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        assert self.ref_counts[block] >= 0, f"block {block} released twice"
        if self.ref_counts[block] == 0:
            self.free[block] = None
            self.num_cached_free += self.block_hash[block] is not None

    def reset_prefix_cache(self) -> None:
        for block in self.free:
            self.block_hash[block] = None
        self.cached = {h: b for h, b in self.cached.items() if self.ref_counts[b] > 0}
        self.num_cached_free = 0
