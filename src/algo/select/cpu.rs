//! The CPU twin of every selection strategy: per key, its build count,
//! spent as probe copies are kept, in tables radix-partitioned over the host
//! threads (hash maps, or arrays over a dense key domain).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use datafusion::arrow::buffer::BooleanBuffer;

use super::{key_range_chunks, words_to_bool, SetOp};

/// CPU twin: same rules, a table of build counts per key.
pub fn select_cpu(op: SetOp, build: &[u64], probe: &[u64]) -> BooleanBuffer {
    select_cpu_chunks(op, &[build], &[probe])
}

/// Multiply-xorshift hasher for 64-bit keys: SipHash (std's default) costs
/// more than the whole probe on these tables. The finish multiplies again:
/// the radix partitions take the product's top bits, and hashbrown its tags
/// from the hash's top 7, which would otherwise be one value per partition
/// (every slot of a group then compared its key: 2-3x slower probes).
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        (self.0 ^ (self.0 >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93)
    }
}

pub(super) type KeyMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// A key's slot after EXCEPT DISTINCT kept it (never a build count: those are below).
const SEEN: u32 = u32::MAX;

/// The rule on one probe row whose key's slot holds `slot`: its build count
/// less the copies kept so far (0: not in the build side). Spending the count
/// copy by copy, in row order, keeps exactly the rows the ranks of seed 002
/// keep: INTERSECT ALL the first n copies, EXCEPT ALL all but the first n,
/// the DISTINCT forms the first copy.
#[inline(always)]
fn keep(op: SetOp, slot: &mut u32) -> bool {
    match op {
        SetOp::Semi => *slot > 0,
        SetOp::Anti => *slot == 0,
        SetOp::IntersectAll => {
            let hit = *slot > 0;
            *slot -= hit as u32;
            hit
        }
        SetOp::ExceptAll => {
            let hit = *slot > 0;
            *slot -= hit as u32;
            !hit
        }
        SetOp::IntersectDistinct => std::mem::take(slot) > 0,
        SetOp::ExceptDistinct => {
            let first = *slot == 0;
            if first {
                *slot = SEEN;
            }
            first
        }
    }
}

/// One partition's slots: a hash map, or an array over a key range.
enum Table {
    Hash(KeyMap<u32>),
    Dense { lo: u64, slots: Vec<u32> },
}

impl Table {
    fn add_build(&mut self, k: u64) {
        let slot = match self {
            Table::Hash(map) => map.entry(k).or_default(),
            Table::Dense { lo, slots } => &mut slots[(k - *lo) as usize],
        };
        // Counts stop one below SEEN (4 billion copies of one key).
        *slot = (*slot + 1).min(SEEN - 1);
    }

    fn probe(&mut self, op: SetOp, k: u64) -> bool {
        match self {
            Table::Dense { lo, slots } => keep(op, &mut slots[(k - *lo) as usize]),
            Table::Hash(map) => match map.get_mut(&k) {
                Some(slot) => keep(op, slot),
                // Only EXCEPT DISTINCT remembers keys the build side lacks.
                None if op == SetOp::ExceptDistinct => {
                    map.insert(k, SEEN);
                    true
                }
                None => keep(op, &mut 0),
            },
        }
    }
}

/// How keys map to partitions: by hash, or by range over a dense domain
/// (partition p holds [lo + p << shift, lo + (p + 1) << shift)).
#[derive(Clone, Copy)]
enum Split {
    Hash,
    Range { lo: u64, shift: u32 },
}

impl Split {
    /// A domain [lo, hi] at most this many times the keys is dense: its
    /// arrays cost at most ~4 bytes a slot to clear, against a hash map's
    /// ~10 ns a key.
    const DENSE_SLOTS_PER_KEY: u64 = 8;

    fn new(range: Option<(u64, u64)>, keys: usize) -> Self {
        match range {
            Some((lo, hi)) if hi - lo < (keys as u64).saturating_mul(Self::DENSE_SLOTS_PER_KEY).min(1 << 32) => {
                Split::range(lo, hi)
            }
            _ => Split::Hash,
        }
    }

    /// Partitions by range over [lo, hi].
    fn range(lo: u64, hi: u64) -> Self {
        let bits = 64 - (hi - lo).leading_zeros();
        Split::Range { lo, shift: bits.saturating_sub(CPU_PART_BITS) }
    }

    #[inline(always)]
    fn part(self, k: u64) -> usize {
        match self {
            Split::Hash => (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CPU_PART_BITS)) as usize,
            Split::Range { lo, shift } => ((k - lo) >> shift) as usize,
        }
    }

    /// Partition p's empty table, for `build_len` build keys.
    fn table(self, p: usize, build_len: usize) -> Table {
        match self {
            Split::Hash => Table::Hash(KeyMap::with_capacity_and_hasher(build_len, Default::default())),
            Split::Range { lo, shift } => {
                Table::Dense { lo: lo + ((p as u64) << shift), slots: crate::util::written_defaults(1 << shift) }
            }
        }
    }
}

/// The rule over one partition: its build keys, then its probe rows (row, key) in row order.
fn select_serial(
    op: SetOp,
    mut table: Table,
    build: impl Iterator<Item = u64>,
    probe: impl Iterator<Item = (usize, u64)>,
    mut set: impl FnMut(usize),
) {
    build.for_each(|k| table.add_build(k));
    for (i, k) in probe {
        if table.probe(op, k) {
            set(i);
        }
    }
}

/// Radix partitions of the parallel CPU selection: many more than threads, so
/// each partition's table stays near the cache and the pool balances them.
pub(super) const CPU_PART_BITS: u32 = 8;
/// Keys per partitioning task.
pub(super) const CPU_PIECE: usize = 1 << 20;

/// Split chunks into pieces of at most `size` keys (the partitioning tasks:
/// [`CPU_PIECE`] unless the caller wants more of them), each with its first row.
pub(super) fn pieces<'a>(chunks: &[&'a [u64]], size: usize) -> Vec<(usize, &'a [u64])> {
    let mut out = Vec::new();
    let mut at = 0;
    for c in chunks {
        for piece in c.chunks(size) {
            out.push((at, piece));
            at += piece.len();
        }
    }
    out
}

/// One piece's items grouped by partition in one allocation: partition p's
/// are `items[starts[p]..starts[p + 1]]`, in the piece's order. (A vector
/// a partition made 256 small allocations a piece: on an H200 host's 16
/// threads, bucketing 4M keys so took ~55 ms, the allocator growing its
/// arenas page by page under the kernel's memory-map lock.)
pub(super) struct Buckets<T> {
    items: Vec<T>,
    starts: Vec<u32>,
}

impl<T: Copy + Default> Buckets<T> {
    /// Items `item(j)` for j in 0..len (at most 2^32 - 1), each in partition
    /// `part_of(j)` (below `parts`): counted, then placed.
    pub(super) fn of(len: usize, parts: usize, part_of: impl Fn(usize) -> usize, item: impl Fn(usize) -> T) -> Self {
        let mut items = crate::util::written_defaults::<T>(len);
        let starts = place(len, parts, &part_of, |at, j| items[at] = item(j));
        Buckets { items, starts }
    }
}

impl Buckets<u64> {
    /// A piece's keys and their offsets in it (`Buckets::of` of each, with
    /// one count and one placement).
    pub(super) fn with_offsets(keys: &[u64], parts: usize, part_of: impl Fn(u64) -> usize) -> (Self, Buckets<u32>) {
        let mut items = crate::util::written_defaults::<u64>(keys.len());
        let mut offsets = crate::util::written_defaults::<u32>(keys.len());
        let starts = place(keys.len(), parts, &|j| part_of(keys[j]), |at, j| {
            items[at] = keys[j];
            offsets[at] = j as u32;
        });
        (Buckets { items, starts: starts.clone() }, Buckets { items: offsets, starts })
    }
}

/// A counting sort's two passes over `len` items in `parts` partitions (by
/// `part_of`): counts them, then calls `put(at, j)` with item j's place in
/// partition order. Returns where each partition starts, and (last) where
/// they end.
fn place(len: usize, parts: usize, part_of: &impl Fn(usize) -> usize, mut put: impl FnMut(usize, usize)) -> Vec<u32> {
    let mut starts = vec![0u32; parts + 1];
    (0..len).for_each(|j| starts[part_of(j) + 1] += 1);
    for p in 0..parts {
        starts[p + 1] += starts[p];
    }
    let mut at = starts[..parts].to_vec();
    for j in 0..len {
        let p = part_of(j);
        put(at[p] as usize, j);
        at[p] += 1;
    }
    starts
}

impl<T> std::ops::Index<usize> for Buckets<T> {
    type Output = [T];

    /// Partition p's items.
    fn index(&self, p: usize) -> &[T] {
        &self.items[self.starts[p] as usize..self.starts[p + 1] as usize]
    }
}

/// Every piece's keys split into `parts` buckets by `part`, on the host
/// threads: `out[piece][partition]`, each in the piece's order.
pub(super) fn bucket_keys(
    pieces: &[(usize, &[u64])],
    parts: usize,
    part: impl Fn(u64) -> usize + Sync,
) -> Vec<Buckets<u64>> {
    let Ok(buckets): Result<Vec<Buckets<u64>>, std::convert::Infallible> =
        crate::host::par_map(pieces, 1, |(_, keys)| Ok(Buckets::of(keys.len(), parts, |j| part(keys[j]), |j| keys[j])));
    buckets
}

/// [`select_cpu`] over keys given in chunks (read back to back), on the host
/// copy threads: every piece of keys is radix-partitioned in parallel (by
/// hash, or by range over a dense domain), then each partition applies the
/// rule on its own, reading its probe keys in row order (piece by piece),
/// which the ALL rules need.
pub fn select_cpu_chunks(op: SetOp, build_chunks: &[&[u64]], probe_chunks: &[&[u64]]) -> BooleanBuffer {
    use std::convert::Infallible;
    let probe_len: usize = probe_chunks.iter().map(|c| c.len()).sum();
    let build_len: usize = build_chunks.iter().map(|c| c.len()).sum();
    let all: Vec<&[u64]> = build_chunks.iter().chain(probe_chunks).copied().collect();
    let split = Split::new(key_range_chunks(&all), probe_len + build_len);
    if crate::host::copy_threads() == 1 || probe_len + build_len < (1 << 16) {
        let mut words = crate::util::written_defaults::<u32>(probe_len.div_ceil(32));
        let table = match split {
            Split::Range { lo, shift } => {
                Table::Dense { lo, slots: crate::util::written_defaults((1usize << shift) << CPU_PART_BITS) }
            }
            Split::Hash => split.table(0, build_len),
        };
        let build = build_chunks.iter().flat_map(|c| c.iter().copied());
        let probe = probe_chunks.iter().flat_map(|c| c.iter().copied()).enumerate();
        select_serial(op, table, build, probe, |i| words[i >> 5] |= 1 << (i & 31));
        return words_to_bool(words, probe_len);
    }
    let parts = 1usize << CPU_PART_BITS;
    let build_buckets = bucket_keys(&pieces(build_chunks, CPU_PIECE), parts, |k| split.part(k));
    // Probe rows are bucketed as 32-bit offsets into their piece (a piece holds
    // at most CPU_PIECE keys), not (row, key) pairs: 4 bytes a row instead of 16.
    // In a fresh process every scratch byte is a page fault first: on TPC-H SF10
    // (52M probe rows) the pairs cost ~600 MB of faults, ~0.15 s.
    let probe_pieces = pieces(probe_chunks, CPU_PIECE);
    let Ok(probe_buckets): Result<Vec<Buckets<u32>>, Infallible> =
        crate::host::par_map(&probe_pieces, 1, |(_, keys)| {
            Ok(Buckets::of(keys.len(), parts, |j| split.part(keys[j]), |j| j as u32))
        });
    let words: Vec<AtomicU32> = crate::util::written_defaults(probe_len.div_ceil(32));
    let ids: Vec<usize> = (0..parts).collect();
    let Ok(_): Result<Vec<()>, Infallible> = crate::host::par_map(&ids, 1, |&p| {
        let n = build_buckets.iter().map(|b| b[p].len()).sum();
        let build = build_buckets.iter().flat_map(|b| b[p].iter().copied());
        let probe = probe_buckets
            .iter()
            .zip(&probe_pieces)
            .flat_map(|(b, (at, keys))| b[p].iter().map(move |&j| (at + j as usize, keys[j as usize])));
        // Kept rows of one word are set at once: a range partition of keys
        // in row order (TPC-H's order keys) keeps runs of neighbouring rows.
        let (mut word, mut bits) = (usize::MAX, 0u32);
        select_serial(op, split.table(p, n), build, probe, |i| {
            if i >> 5 != word {
                if bits != 0 {
                    words[word].fetch_or(bits, Ordering::Relaxed);
                }
                (word, bits) = (i >> 5, 0);
            }
            bits |= 1 << (i & 31);
        });
        if bits != 0 {
            words[word].fetch_or(bits, Ordering::Relaxed);
        }
        Ok(())
    });
    crate::host::drop_later((build_buckets, probe_buckets));
    words_to_bool(words.into_iter().map(AtomicU32::into_inner).collect(), probe_len)
}

/// Build counts shared by concurrent probes, for a probe side read batch by
/// batch on any thread (the CPU backend's streamed set operations). Each
/// probe row spends its key's count atomically as [`keep`] spends it
/// serially: INTERSECT ALL keeps min(m, n) of a key's m probe copies, EXCEPT
/// ALL max(m - n, 0), INTERSECT one. Which copies are kept depends on the
/// threads' order, so the answer is SQL's multiset wherever equal keys are
/// equal rows (set operations, whose output is their keys); EXCEPT DISTINCT,
/// which must remember probe keys, is not offered.
pub struct SharedCounts {
    op: SetOp,
    split: Split,
    /// Keys are below this.
    size: u64,
    parts: Vec<CountPart>,
    bytes: usize,
}

/// One partition of [`SharedCounts`]: hash buckets of one cache line each
/// (linear probing from bucket to bucket), or an array over a key range.
enum CountPart {
    Hash { lines: Vec<CountLine> },
    Dense { lo: u64, counts: Vec<AtomicU32> },
}

/// A hash bucket: five keys and their counts in one cache line, so a lookup
/// is one miss and compares the line's keys without branching on them.
#[repr(C, align(64))]
struct CountLine {
    keys: [u64; CountLine::WIDTH],
    counts: [AtomicU32; CountLine::WIDTH],
}

impl CountLine {
    const WIDTH: usize = 5;

    fn empty() -> Self {
        CountLine { keys: [SharedCounts::EMPTY; Self::WIDTH], counts: Default::default() }
    }

    /// Bit j set where `keys[j]` is `k`, and where it is free.
    #[inline(always)]
    fn matches(&self, k: u64) -> (u32, u32) {
        let (mut hit, mut free) = (0, 0);
        for (j, &key) in self.keys.iter().enumerate() {
            hit |= ((key == k) as u32) << j;
            free |= ((key == SharedCounts::EMPTY) as u32) << j;
        }
        (hit, free)
    }
}

impl SharedCounts {
    /// The free slot's key (keys are below `size`, which is at most this).
    const EMPTY: u64 = u64::MAX;
    /// A dense domain has at most this many slots a build key: an array's
    /// 4 bytes a slot against a bucket's ~32 bytes a key, and one load a
    /// probe against a search.
    const DENSE_SLOTS_PER_KEY: u64 = 16;
    /// Hash buckets hold this many keys on average (of
    /// [`CountLine::WIDTH`]): a full home bucket sends a lookup on to the
    /// next line, which 5.3% of buckets are at a mean of 2 (Poisson).
    const KEYS_PER_LINE: usize = 2;
    /// Rows of a batch looked up together: their first lines are loaded
    /// first, then searched, then spent.
    const BLOCK: usize = 64;

    /// The counts of `build`'s keys (all below `size` <= 2^64 - 1), built
    /// on the host threads; None for EXCEPT DISTINCT.
    pub fn new(op: SetOp, build: &[&[u64]], size: u64) -> Option<Self> {
        if op == SetOp::ExceptDistinct {
            return None;
        }
        let n: usize = build.iter().map(|c| c.len()).sum();
        let split = match size {
            0 => Split::Hash,
            _ if size <= (n as u64).saturating_mul(Self::DENSE_SLOTS_PER_KEY).min(1 << 32) => Split::range(0, size - 1),
            _ => Split::Hash,
        };
        // Pieces of 64K keys: a 4M-key build side is 64 tasks for the threads, not 4.
        let buckets = bucket_keys(&pieces(build, 1 << 16), 1 << CPU_PART_BITS, |k| split.part(k));
        crate::util::trace("shared counts: keys bucketed");
        let ids: Vec<usize> = (0..1 << CPU_PART_BITS).collect();
        let Ok(parts): Result<Vec<CountPart>, std::convert::Infallible> = crate::host::par_map(&ids, 1, |&p| {
            let keys = || buckets.iter().flat_map(|b| b[p].iter().copied());
            let add = |count: &mut AtomicU32| {
                let c = count.get_mut();
                *c = c.saturating_add(1);
            };
            Ok(match split {
                Split::Range { lo, shift } => {
                    let lo = lo + ((p as u64) << shift);
                    let mut counts = crate::util::written_defaults::<AtomicU32>(1 << shift);
                    keys().for_each(|k| add(&mut counts[(k - lo) as usize]));
                    CountPart::Dense { lo, counts }
                }
                Split::Hash => {
                    let len = buckets.iter().map(|b| b[p].len()).sum::<usize>();
                    let lines_len = len.div_ceil(Self::KEYS_PER_LINE).max(1);
                    let mut lines: Vec<CountLine> = Vec::with_capacity(lines_len);
                    lines.resize_with(lines_len, CountLine::empty);
                    for k in keys() {
                        let mut i = Self::home_line(k, lines.len());
                        loop {
                            let (hit, free) = lines[i].matches(k);
                            if let Some(j) = [hit, free].into_iter().find(|&m| m != 0) {
                                let line = &mut lines[i];
                                line.keys[j.trailing_zeros() as usize] = k;
                                add(&mut line.counts[j.trailing_zeros() as usize]);
                                break;
                            }
                            i = if i + 1 == lines.len() { 0 } else { i + 1 };
                        }
                    }
                    CountPart::Hash { lines }
                }
            })
        });
        crate::host::drop_later(buckets);
        crate::util::trace("shared counts: built");
        let bytes = parts
            .iter()
            .map(|p| match p {
                CountPart::Hash { lines } => lines.len() * std::mem::size_of::<CountLine>(),
                CountPart::Dense { counts, .. } => counts.len() * 4,
            })
            .sum();
        Some(SharedCounts { op, split, size, parts, bytes })
    }

    /// A key's home bucket among `lines`: a second product's top bits (the
    /// partition took the first's), scaled to the number of lines.
    #[inline(always)]
    fn home_line(k: u64, lines: usize) -> usize {
        let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let h = (h ^ (h >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        ((h as u128 * lines as u128) >> 64) as usize
    }

    /// Bytes the table holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Is the table an array over the key domain (else hash tables)?
    pub fn is_dense(&self) -> bool {
        matches!(self.split, Split::Range { .. })
    }

    /// The count of key `k`, if the build side has it.
    #[inline(always)]
    fn count(&self, k: u64) -> Option<&AtomicU32> {
        let (p, at) = self.home(k);
        self.find(k, p, at)
    }

    /// Where key `k`'s lookup starts: its partition, and its slot (dense)
    /// or home line (hash) there; `u32::MAX` where `k` is not below `size`.
    #[inline(always)]
    fn home(&self, k: u64) -> (usize, u32) {
        let p = self.split.part(k.min(self.size.saturating_sub(1)));
        let at = match &self.parts[p] {
            CountPart::Dense { lo, .. } => k.wrapping_sub(*lo) as u32,
            CountPart::Hash { lines } => Self::home_line(k, lines.len()) as u32,
        };
        (p, if k < self.size { at } else { u32::MAX })
    }

    /// The count of key `k` from its [`SharedCounts::home`]. A hash lookup
    /// branches on what it loads only where the home line is full without `k`.
    #[inline(always)]
    fn find(&self, k: u64, p: usize, at: u32) -> Option<&AtomicU32> {
        match &self.parts[p] {
            CountPart::Dense { counts, .. } => counts.get(at as usize),
            CountPart::Hash { lines } => {
                let mut i = at as usize;
                loop {
                    let line = lines.get(i)?;
                    let (hit, free) = line.matches(k);
                    if hit | free != 0 {
                        // Where no key matched, `hit` is 0: index 32, past the counts.
                        return line.counts.get(hit.trailing_zeros() as usize);
                    }
                    i = if i + 1 == lines.len() { 0 } else { i + 1 };
                }
            }
        }
    }

    /// A load of the first word a lookup from `(p, at)` reads (the value
    /// only keeps the load), with no branch on what it holds.
    #[inline(always)]
    fn touch(&self, p: usize, at: u32) -> u64 {
        match &self.parts[p] {
            CountPart::Dense { counts, .. } => counts.get(at as usize).map_or(0, |c| c.load(Ordering::Relaxed) as u64),
            CountPart::Hash { lines } => lines.get(at as usize).map_or(0, |l| l.keys[0]),
        }
    }

    /// Is a probe row of key `k` kept? Spends the key's count as the rule says.
    pub fn keep(&self, k: u64) -> bool {
        self.spend(self.live(self.count(k)))
    }

    /// Which rows of one probe batch (`keys`) are kept, their counts spent as
    /// [`SharedCounts::keep`] spends them. A block's first lines are loaded
    /// together (their addresses computed before), then searched, then
    /// spent: a lookup that branched on a missed line would wait for it (a
    /// mispredicted branch discards the loads after it), and a spend's
    /// atomic read-modify-write orders the loads after it. Measured here (4M
    /// build keys in 122 MB, 8M probe rows, one thread): 75-95 ns a row for
    /// linear probing in 16-byte slots, 50-60 ns so (BENCHMARKS section 42).
    pub fn keep_batch(&self, keys: &[u64]) -> BooleanBuffer {
        let mut words: Vec<u64> = Vec::with_capacity(keys.len().div_ceil(64));
        let mut homes: Vec<(usize, u32)> = Vec::with_capacity(Self::BLOCK);
        let mut found: Vec<Option<&AtomicU32>> = Vec::with_capacity(Self::BLOCK);
        for block in keys.chunks(Self::BLOCK) {
            homes.clear();
            homes.extend(block.iter().map(|&k| self.home(k)));
            std::hint::black_box(homes.iter().fold(0u64, |acc, &(p, at)| acc ^ self.touch(p, at)));
            found.clear();
            found.extend(block.iter().zip(&homes).map(|(&k, &(p, at))| self.live(self.find(k, p, at))));
            for rows in found.chunks(64) {
                words.push(rows.iter().enumerate().fold(0u64, |w, (j, c)| w | (self.spend(*c) as u64) << j));
            }
        }
        BooleanBuffer::new(datafusion::arrow::buffer::Buffer::from_vec(words), 0, keys.len())
    }

    /// A key's count while it is above 0 (None: not in the build side, or spent).
    #[inline(always)]
    fn live<'a>(&self, count: Option<&'a AtomicU32>) -> Option<&'a AtomicU32> {
        count.filter(|c| c.load(Ordering::Relaxed) > 0)
    }

    /// The rule on a probe row whose key's count was `live`: spend it.
    #[inline(always)]
    fn spend(&self, live: Option<&AtomicU32>) -> bool {
        let spend_one =
            |c: &AtomicU32| c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok();
        match self.op {
            SetOp::Semi => live.is_some(),
            SetOp::Anti => live.is_none(),
            SetOp::IntersectAll => live.is_some_and(spend_one),
            SetOp::ExceptAll => !live.is_some_and(spend_one),
            SetOp::IntersectDistinct => live.is_some_and(|c| c.swap(0, Ordering::Relaxed) > 0),
            // Never built (see `new`).
            SetOp::ExceptDistinct => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::select::multiset_reference;

    /// The rules as seed 002 states them, per probe row from its rank among
    /// equal probe keys (r) and its key's build copies (n).
    fn by_ranks(op: SetOp, build: &[u64], probe: &[u64]) -> Vec<bool> {
        let mut n: HashMap<u64, usize> = HashMap::new();
        build.iter().for_each(|k| *n.entry(*k).or_default() += 1);
        let mut ranks: HashMap<u64, usize> = HashMap::new();
        probe
            .iter()
            .map(|k| {
                let (n, r) = (n.get(k).copied().unwrap_or(0), ranks.entry(*k).or_default());
                let keep = match op {
                    SetOp::Semi => n > 0,
                    SetOp::Anti => n == 0,
                    SetOp::IntersectAll => *r < n,
                    SetOp::ExceptAll => *r >= n,
                    SetOp::IntersectDistinct => n > 0 && *r == 0,
                    SetOp::ExceptDistinct => n == 0 && *r == 0,
                };
                *r += 1;
                keep
            })
            .collect()
    }

    /// Dense domains (range partitions, arrays) and sparse ones (hash
    /// partitions, maps), small inputs (one table) and large ones (radix
    /// partitions over the threads), chunked unevenly, empty sides: the kept
    /// rows are exactly those of the rank rules, and their keys SQL's multiset.
    #[test]
    fn spent_counts_keep_the_rows_of_the_rank_rules() {
        let mut rng = crate::util::Xorshift64(0x5e7f);
        let ops = [
            SetOp::Semi,
            SetOp::Anti,
            SetOp::IntersectAll,
            SetOp::ExceptAll,
            SetOp::IntersectDistinct,
            SetOp::ExceptDistinct,
        ];
        // (build rows, probe rows, key domain, key stride): stride 1 is dense, a large one sparse.
        let shapes = [
            (0, 1000, 50, 1),
            (1000, 0, 50, 1),
            (3000, 5000, 2000, 1),
            (3000, 5000, 2000, 1 << 40),
            (120_000, 300_000, 200_000, 3),
            (120_000, 300_000, 200_000, 0x9E37_79B9),
            (50_000, 200_000, 1 << 30, 1),
        ];
        for (nb, np, domain, stride) in shapes {
            let mut draw = |n: usize| -> Vec<u64> { (0..n).map(|_| 7 + rng.below(domain) * stride).collect() };
            let (build, probe) = (draw(nb), draw(np));
            for op in ops {
                let want = by_ranks(op, &build, &probe);
                let cut = |v: &[u64]| -> Vec<Vec<u64>> { v.chunks(8191).map(|c| c.to_vec()).collect() };
                let (bc, pc) = (cut(&build), cut(&probe));
                let (bs, ps): (Vec<&[u64]>, Vec<&[u64]>) =
                    (bc.iter().map(|c| c.as_slice()).collect(), pc.iter().map(|c| c.as_slice()).collect());
                let got = select_cpu_chunks(op, &bs, &ps);
                assert_eq!(got.len(), probe.len());
                let got_rows: Vec<bool> = got.iter().collect();
                assert!(got_rows == want, "{op:?} nb={nb} np={np} domain={domain} stride={stride}");
                let mut kept: Vec<u64> = got.set_indices().map(|i| probe[i]).collect();
                kept.sort_unstable();
                assert_eq!(kept, multiset_reference(op, &build, &probe), "{op:?} multiset");
            }
        }
    }

    /// Probe chunks spent by several threads at once, in any order: the kept
    /// keys are SQL's multiset for every rule offered, over dense and sparse
    /// domains, with keys outside the build side's domain and empty sides.
    #[test]
    fn shared_counts_spent_by_threads_keep_the_multiset() {
        let mut rng = crate::util::Xorshift64(0x51a7);
        let ops = [SetOp::Semi, SetOp::Anti, SetOp::IntersectAll, SetOp::ExceptAll, SetOp::IntersectDistinct];
        assert!(SharedCounts::new(SetOp::ExceptDistinct, &[], 10).is_none());
        // (build rows, probe rows, domain, stride): stride 1 is dense, a large one sparse.
        let shapes = [
            (0, 1000, 50, 1),
            (1000, 0, 50, 1),
            (3000, 5000, 2000, 1),
            (3000, 5000, 2000, 1 << 40),
            (200_000, 400_000, 150_000, 1),
            (200_000, 400_000, 150_000, 0x9E37_79B9),
        ];
        for (nb, np, domain, stride) in shapes {
            let build: Vec<u64> = (0..nb).map(|_| rng.below(domain) * stride).collect();
            // Probe keys reach past the build side's domain, and to ABSENT.
            let mut probe: Vec<u64> = (0..np).map(|_| rng.below(domain + domain / 4) * stride).collect();
            probe.iter_mut().step_by(97).for_each(|k| *k = u64::MAX);
            let size = build.iter().max().map_or(1, |m| m + 1);
            for op in ops {
                let counts = SharedCounts::new(op, &[&build], size).unwrap();
                assert_eq!(counts.is_dense(), stride == 1 && nb > 0, "{op:?} {nb} {stride}");
                let kept: Vec<std::sync::Mutex<Vec<u64>>> = (0..4).map(|_| Default::default()).collect();
                crate::host::scope(|s| {
                    for (t, slot) in kept.iter().enumerate() {
                        let (counts, probe) = (&counts, &probe);
                        s.spawn("test", move || {
                            // Thread t takes every fourth chunk, from the back for odd t.
                            let chunks: Vec<&[u64]> = probe.chunks(777).skip(t).step_by(4).collect();
                            let order: Vec<&&[u64]> =
                                if t % 2 == 1 { chunks.iter().rev().collect() } else { chunks.iter().collect() };
                            let mut out = slot.lock().unwrap();
                            for c in order {
                                // Threads 0 and 1 spend row by row, 2 and 3 batch by batch.
                                match t < 2 {
                                    true => out.extend(c.iter().copied().filter(|&k| counts.keep(k))),
                                    false => out.extend(counts.keep_batch(c).set_indices().map(|i| c[i])),
                                }
                            }
                        });
                    }
                });
                let mut got: Vec<u64> = kept.into_iter().flat_map(|m| m.into_inner().unwrap()).collect();
                got.sort_unstable();
                assert_eq!(got, multiset_reference(op, &build, &probe), "{op:?} nb={nb} np={np} stride={stride}");
            }
        }
    }

    /// Buckets keep each partition's items in the piece's order, empty
    /// partitions and an empty piece included.
    #[test]
    fn buckets_group_items_in_order() {
        let keys: Vec<u64> = (0..1000u64).map(|i| i * 7919 % 1009).collect();
        for parts in [1, 3, 256] {
            let b = Buckets::of(keys.len(), parts, |j| (keys[j] % parts as u64) as usize, |j| keys[j]);
            for p in 0..parts {
                let want: Vec<u64> = keys.iter().copied().filter(|k| (k % parts as u64) as usize == p).collect();
                assert_eq!(&b[p], want.as_slice(), "parts {parts} partition {p}");
            }
            let (k, r) = Buckets::with_offsets(&keys, parts, |k| (k % parts as u64) as usize);
            for p in 0..parts {
                assert_eq!(&k[p], &b[p], "parts {parts} partition {p}");
                assert!(r[p].iter().zip(&k[p]).all(|(&j, &key)| keys[j as usize] == key));
            }
            let none = Buckets::<u32>::of(0, parts, |_| 0, |_| 0);
            assert!((0..parts).all(|p| none[p].is_empty()));
        }
    }

    #[test]
    fn dense_domains_split_by_range() {
        assert!(matches!(Split::new(Some((10, 10 + 799)), 100), Split::Range { lo: 10, shift: 2 }));
        assert!(matches!(Split::new(Some((0, 800)), 100), Split::Hash));
        assert!(matches!(Split::new(None, 0), Split::Hash));
        assert!(matches!(Split::new(Some((0, u64::MAX)), usize::MAX), Split::Hash));
        // Every key of the domain lands in one of the 256 partitions.
        let s = Split::new(Some((5, 5 + 999_999)), 1 << 20);
        assert!(s.part(5) == 0 && s.part(5 + 999_999) < 1 << CPU_PART_BITS);
    }
}
