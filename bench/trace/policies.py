"""Replacement policies, simulated offline on a block access sequence.

The model: a cache of `capacity` blocks; every access (a read or a write of
a block, in trace order) is a hit if the block is cached, else a miss, and
on a miss the block is inserted (writes too: a writeback cache allocates
on write), evicting one block if the cache is full. Policies with an
admission rule (OPT with bypass, smq) may decline to insert. A miss is a
miss whether or not the block is then inserted.

Each policy is a class with `access(block) -> bool` (True on a hit), or a
function over the whole sequence for the offline optimum. `simulate`
runs one and returns a hit flag per access.

Ghost histories (remembered evicted keys, no data) are sized as their
papers recommend: S3-FIFO 90% of the cache (as many entries as the main
queue), ARC up to the cache size (B1 + B2 <= c), 2Q half the cache (Kout).

Policies:
  lru         least recently used
  fifo        first in, first out
  s3fifo      S3-FIFO (Yang et al., SOSP'23), as in the authors' libCacheSim
              S3FIFOv0 ("the original implementation used in the paper"):
              small FIFO 10%, main FIFO 90% with a 2-bit CLOCK counter,
              ghost 90%; an object leaves the small queue for the main
              queue if it was hit at least twice there (move-to-main
              threshold 2); it enters the main queue with its count reset.
  s3fifo-tc   S3-FIFO as tiercache's engine implements it
              (src/engine/policy/s3fifo.rs): one hit in the small queue is
              enough (threshold 1), the count moves along; exact ghost here
              (the engine's is a two-generation Bloom filter).
  arc         ARC (Megiddo and Modha, FAST'03), the paper's algorithm.
  sieve       SIEVE (Zhang et al., NSDI'24).
  2q          2Q, full version (Johnson and Shasha, VLDB'94): A1in FIFO 25%,
              A1out ghost 50%, Am LRU.
  smq         a simplified dm-cache smq (see class SmqLike).
  opt         Belady's MIN: evict the block whose next use is farthest.
  opt-bypass  MIN that may also decline to insert the missed block when its
              own next use is the farthest: optimal when admission is
              allowed; a lower bound for every policy here.
"""

import heapq
from collections import OrderedDict


class Lru:
    def __init__(self, capacity):
        self.cap = capacity
        self.d = OrderedDict()

    def access(self, k):
        d = self.d
        if k in d:
            d.move_to_end(k)
            return True
        if len(d) >= self.cap:
            d.popitem(last=False)
        d[k] = None
        return False


class Fifo:
    def __init__(self, capacity):
        self.cap = capacity
        self.order = OrderedDict()

    def access(self, k):
        d = self.order
        if k in d:
            return True
        if len(d) >= self.cap:
            d.popitem(last=False)
        d[k] = None
        return False


class S3Fifo:
    """S3-FIFO. Queues are OrderedDicts from the tail (oldest, first) to the
    head (newest, last); values are access counts."""

    def __init__(self, capacity, small_ratio=0.1, ghost_ratio=0.9, move_threshold=2,
                 keep_count=False):
        self.cap = capacity
        self.small_cap = max(1, int(capacity * small_ratio))
        self.ghost_cap = int(capacity * ghost_ratio)
        self.move_threshold = move_threshold
        self.keep_count = keep_count
        self.small = OrderedDict()
        self.main = OrderedDict()
        self.ghost = OrderedDict()

    def access(self, k):
        small, main = self.small, self.main
        if k in small:
            small[k] += 1
            return True
        if k in main:
            if main[k] < 3:
                main[k] += 1
            return True
        in_ghost = k in self.ghost
        if in_ghost:
            del self.ghost[k]
        while len(small) + len(main) >= self.cap:
            self._evict()
        if in_ghost:
            main[k] = 0
        else:
            small[k] = 0
        return False

    def _evict(self):
        if len(self.small) >= self.small_cap or not self.main:
            self._evict_small()
        else:
            self._evict_main()

    def _evict_small(self):
        small, main = self.small, self.main
        while small:
            k, count = small.popitem(last=False)
            if count >= self.move_threshold:
                main[k] = min(count, 3) if self.keep_count else 0
                # The cache's size is unchanged; the main queue may now be
                # over its share, which the next eviction takes back.
            else:
                ghost = self.ghost
                ghost[k] = None
                if len(ghost) > self.ghost_cap:
                    ghost.popitem(last=False)
                return

    def _evict_main(self):
        main = self.main
        while main:
            k, count = main.popitem(last=False)
            if count > 0:
                main[k] = count - 1
            else:
                return


class Arc:
    """ARC, as in the paper's Figure 4. T1/T2 hold cached keys, B1/B2 the
    ghosts; each an OrderedDict from LRU (first) to MRU (last)."""

    def __init__(self, capacity):
        self.c = capacity
        self.p = 0.0
        self.t1, self.t2 = OrderedDict(), OrderedDict()
        self.b1, self.b2 = OrderedDict(), OrderedDict()

    def _replace(self, in_b2):
        t1 = self.t1
        if t1 and ((in_b2 and len(t1) == self.p) or len(t1) > self.p):
            k, _ = t1.popitem(last=False)
            self.b1[k] = None
        else:
            k, _ = self.t2.popitem(last=False)
            self.b2[k] = None

    def access(self, x):
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        if x in t1:
            del t1[x]
            t2[x] = None
            return True
        if x in t2:
            t2.move_to_end(x)
            return True
        c = self.c
        if x in b1:
            delta = 1.0 if len(b1) >= len(b2) else len(b2) / len(b1)
            self.p = min(float(c), self.p + delta)
            self._replace(False)
            del b1[x]
            t2[x] = None
            return False
        if x in b2:
            delta = 1.0 if len(b2) >= len(b1) else len(b1) / len(b2)
            self.p = max(0.0, self.p - delta)
            self._replace(True)
            del b2[x]
            t2[x] = None
            return False
        l1 = len(t1) + len(b1)
        if l1 == c:
            if len(t1) < c:
                b1.popitem(last=False)
                self._replace(False)
            else:
                t1.popitem(last=False)
        else:
            total = l1 + len(t2) + len(b2)
            if total >= c:
                if total == 2 * c:
                    b2.popitem(last=False)
                self._replace(False)
        t1[x] = None
        return False


class Sieve:
    """SIEVE: one FIFO queue with a visited bit per key and a hand that moves
    from the tail (oldest) towards the head, clearing visited bits and
    evicting the first key without one. New keys go to the head."""

    def __init__(self, capacity):
        self.cap = capacity
        self.visited = {}
        self.newer = {}   # key -> the next key towards the head (None at the head)
        self.older = {}   # key -> the next key towards the tail (None at the tail)
        self.head = None
        self.tail = None
        self.hand = None

    def access(self, k):
        visited = self.visited
        if k in visited:
            visited[k] = True
            return True
        if len(visited) >= self.cap:
            self._evict()
        visited[k] = False
        self.newer[k] = None
        self.older[k] = self.head
        if self.head is not None:
            self.newer[self.head] = k
        self.head = k
        if self.tail is None:
            self.tail = k
        return False

    def _evict(self):
        visited, newer = self.visited, self.newer
        o = self.hand if self.hand is not None else self.tail
        while visited[o]:
            visited[o] = False
            o = newer[o]
            if o is None:
                o = self.tail
        self.hand = newer[o]
        self._unlink(o)
        del visited[o]

    def _unlink(self, k):
        n, o = self.newer.pop(k), self.older.pop(k)
        if n is not None:
            self.older[n] = o
        else:
            self.head = o
        if o is not None:
            self.newer[o] = n
        else:
            self.tail = n


class TwoQ:
    """2Q, full version: new keys enter A1in (FIFO, Kin = 25%); keys pushed
    out of A1in are remembered in A1out (ghost, Kout = 50%); a miss on a
    key A1out remembers goes to Am (LRU). A hit in A1in changes nothing."""

    def __init__(self, capacity, kin_ratio=0.25, kout_ratio=0.5):
        self.cap = capacity
        self.kin = max(1, int(capacity * kin_ratio))
        self.kout = max(1, int(capacity * kout_ratio))
        self.a1in = OrderedDict()
        self.a1out = OrderedDict()
        self.am = OrderedDict()

    def _reclaim(self):
        if len(self.a1in) + len(self.am) < self.cap:
            return
        if len(self.a1in) > self.kin or not self.am:
            k, _ = self.a1in.popitem(last=False)
            self.a1out[k] = None
            if len(self.a1out) > self.kout:
                self.a1out.popitem(last=False)
        else:
            self.am.popitem(last=False)

    def access(self, x):
        if x in self.am:
            self.am.move_to_end(x)
            return True
        if x in self.a1in:
            return True
        if x in self.a1out:
            del self.a1out[x]
            self._reclaim()
            self.am[x] = None
        else:
            self._reclaim()
            self.a1in[x] = None
        return False


class SmqLike:
    """A simplified dm-cache smq (drivers/md/dm-cache-policy-smq.c), keeping
    its three ideas: (1) cached blocks sit in a multiqueue of `levels`
    levels; a hit moves a block up one level, eviction takes the oldest
    block of the lowest non-empty level, and every `capacity` accesses all
    blocks move down one level (smq's periodic redistribution, simplified
    to aging); (2) hotspots, runs of `hotspot_blocks` blocks, count hits
    (once per run of consecutive accesses to the same hotspot, so a
    sequential scan warms a hotspot once) in a table of
    max(capacity / 4, 1024) hotspots, aged the same way; (3) a missed block
    is promoted into the cache only while the cache has free blocks or its
    hotspot's level is at least `promote_level`. Left out: smq's
    clean/dirty queues, sentinels, and the promote level it adapts to its
    hit rates."""

    def __init__(self, capacity, levels=8, hotspot_blocks=16, promote_level=1):
        self.cap = capacity
        self.levels = [OrderedDict() for _ in range(levels)]
        self.level_of = {}
        self.hs_blocks = hotspot_blocks
        self.hs_cap = max(capacity // 4, 1024)
        self.hs = OrderedDict()     # hotspot -> level, LRU order
        self.promote_level = promote_level
        self.tick = 0
        self.last_hs = None

    def _age(self):
        top = len(self.levels) - 1
        for lvl in range(1, top + 1):
            src, dst = self.levels[lvl], self.levels[lvl - 1]
            for k in src:
                dst[k] = None
                self.level_of[k] = lvl - 1
            src.clear()
        for h in self.hs:
            if self.hs[h]:
                self.hs[h] -= 1

    def access(self, k):
        self.tick += 1
        if self.tick >= self.cap:
            self.tick = 0
            self._age()
        h = k // self.hs_blocks
        hs = self.hs
        if h != self.last_hs:
            hs[h] = min(hs.get(h, -1) + 1, len(self.levels) - 1)
            hs.move_to_end(h)
            if len(hs) > self.hs_cap:
                hs.popitem(last=False)
        self.last_hs = h
        lvl = self.level_of.get(k)
        if lvl is not None:
            up = min(lvl + 1, len(self.levels) - 1)
            del self.levels[lvl][k]
            self.levels[up][k] = None
            self.level_of[k] = up
            return True
        if len(self.level_of) >= self.cap:
            if hs.get(h, 0) < self.promote_level:
                return False
            for q in self.levels:
                if q:
                    v, _ = q.popitem(last=False)
                    del self.level_of[v]
                    break
        self.levels[0][k] = None
        self.level_of[k] = 0
        return False


def belady(seq, capacity, bypass=False):
    """Belady's MIN over the whole sequence; a hit flag per access."""
    n = len(seq)
    never = n + 1
    next_use = [never] * n
    last = {}
    for i in range(n - 1, -1, -1):
        b = seq[i]
        next_use[i] = last.get(b, never)
        last[b] = i
    cached = {}          # block -> position of its next use
    heap = []            # (-next use, block), stale entries skipped
    hits = bytearray(n)
    push, pop = heapq.heappush, heapq.heappop
    for i in range(n):
        b = seq[i]
        nu = next_use[i]
        if b in cached:
            hits[i] = 1
            cached[b] = nu
            push(heap, (-nu, b))
            continue
        if len(cached) >= capacity:
            while True:
                far, v = heap[0]
                if cached.get(v) == -far:
                    break
                pop(heap)
            if bypass and nu >= -far:
                continue
            pop(heap)
            del cached[v]
        cached[b] = nu
        push(heap, (-nu, b))
    return hits


POLICIES = {
    "lru": Lru,
    "fifo": Fifo,
    "s3fifo": S3Fifo,
    "s3fifo-tc": lambda c: S3Fifo(c, move_threshold=1, keep_count=True),
    "arc": Arc,
    "sieve": Sieve,
    "2q": TwoQ,
    "smq": SmqLike,
    "opt": None,
    "opt-bypass": None,
}


def simulate(name, capacity, seq):
    """Hit flags (bytearray, 1 = hit) of policy `name` with `capacity`
    blocks over the block sequence `seq`."""
    if capacity < 1:
        raise ValueError("capacity must be at least one block")
    if name == "opt":
        return belady(seq, capacity)
    if name == "opt-bypass":
        return belady(seq, capacity, bypass=True)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    access = POLICIES[name](capacity).access
    hits = bytearray(len(seq))
    for i, b in enumerate(seq):
        if access(b):
            hits[i] = 1
    return hits
