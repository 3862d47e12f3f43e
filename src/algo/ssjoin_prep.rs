//! Similarity-join preprocessing (issue 13): raw sets of u64 elements become
//! [`SetCollection`]s, on all host cores ([`preprocess`], the CPU twin) or on
//! the device ([`preprocess_gpu`], kernels/ssjoin_prep.cu). Both produce the
//! same collections:
//!
//! * every set is sorted and deduplicated;
//! * an element's token is its rank in ascending (document frequency over
//!   both inputs, element) order, so rare tokens come first and prefixes are
//!   selective;
//! * tokens are sorted within each set, and sets are ordered by (distinct
//!   size, caller's id).
//!
//! The former single-threaded version (one `HashMap` of frequencies, a sort
//! of the vocabulary, a lookup per element) took 157-231 ms per 100k-set
//! collection on the H100 host, against a 5 ms GPU join; it is kept as the
//! reference in the tests.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use super::ssjoin::{default_threads, RawSets, SetCollection};
use crate::gpu::{cuda_err, Gpu, TransferStats};
use crate::host::for_each_mut;

/// kernels/ssjoin_prep.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "ssjoin_prep",
    source: include_str!("../../kernels/ssjoin_prep.cu"),
    defines: prep_defines,
};

fn prep_defines() -> Vec<(String, u64)> {
    crate::gpu::prefixed(
        "PREP_",
        &[("SMALL", SMALL_SET as u64), ("LARGE", LARGE_SET as u64), ("BLOCK", LARGE_BLOCK as u64)],
    )
}

/// Sort and deduplicate each set.
pub fn dedup_sets(raw: &RawSets) -> RawSets {
    let mut out = RawSets { offsets: Vec::with_capacity(raw.len() + 1), elems: Vec::with_capacity(raw.elems.len()) };
    out.offsets.push(0);
    for i in 0..raw.len() {
        let start = out.elems.len();
        out.elems.extend_from_slice(raw.set(i));
        let kept = sort_dedup(&mut out.elems[start..]);
        out.elems.truncate(start + kept);
        out.offsets.push(out.elems.len());
    }
    out
}

/// Sort `v` and move its distinct values to the front; returns their number.
pub(crate) fn sort_dedup<T: Ord + Copy>(v: &mut [T]) -> usize {
    v.sort_unstable();
    let mut kept = 0;
    for j in 0..v.len() {
        if kept == 0 || v[j] != v[kept - 1] {
            v[kept] = v[j];
            kept += 1;
        }
    }
    kept
}

// ---------------------------------------------------------------------------
// CPU twin
// ---------------------------------------------------------------------------

/// Raw elements per host task: below this a task's hand-off to a pool thread
/// (microseconds) is no longer small against its work (nanoseconds per element).
const ELEMS_PER_TASK: usize = 1 << 16;
/// log2 of the fine buckets (by the high bits of `element - min`) from which
/// the partitions are cut: enough that a partition boundary falls close to
/// its target, few enough that each task's histogram stays in L1.
const FINE_BITS: u32 = 12;
/// A partition counts its elements in a direct table (indexed by
/// `element - partition start`, no hashing, ranks in element order for free)
/// when its key range is at most this many times its entries; sparse keys
/// are hashed.
const DIRECT_SPAN_PER_ENTRY: u64 = 4;

/// One element occurrence of a deduplicated set on its way to its partition:
/// the element, and the position of its token in the output (the
/// concatenated tokens of all collections, in output set order). After
/// counting, `key` holds the element's slot in its partition's table.
#[derive(Clone, Copy, Default)]
struct Entry {
    key: u64,
    pos: u32,
}

/// A range of input sets of one collection, and what the passes learn of it.
struct Chunk {
    coll: usize,
    sets: Range<usize>,
    /// The sets, each sorted and deduplicated, back to back.
    elems: Vec<u64>,
    /// Distinct elements per set.
    sizes: Vec<u32>,
    min: u64,
    max: u64,
    /// Elements per fine bucket (second pass).
    fine: Vec<u32>,
}

/// Maps an element to its fine bucket: `(element - lo) >> shift`.
#[derive(Clone, Copy)]
struct FineBuckets {
    lo: u64,
    shift: u32,
}

impl FineBuckets {
    fn new(lo: u64, hi: u64) -> Self {
        let span_bits = u64::BITS - (hi - lo).leading_zeros();
        FineBuckets { lo, shift: span_bits.saturating_sub(FINE_BITS) }
    }
    #[inline]
    fn of(&self, e: u64) -> usize {
        ((e - self.lo) >> self.shift) as usize
    }
    /// The first element of fine bucket `f` (saturating past the key space).
    fn start(&self, f: usize) -> u128 {
        self.lo as u128 + ((f as u128) << self.shift)
    }
}

/// One partition's count of its elements: a table slot per distinct element
/// (a counter, then the element's rank) and the distinct elements ascending
/// with their slots.
struct PartCount {
    table: Vec<u32>,
    distinct: Vec<(u64, usize)>,
}

/// Open-addressing slot of `key` in a power-of-two table of `keys`, whose
/// free slots have count 0 in `counts`.
#[inline]
fn hash_slot(keys: &[u64], counts: &[u32], key: u64) -> usize {
    let mask = keys.len() - 1;
    let mut x = key;
    // splitmix64's finaliser: clustered integer keys spread over the table.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d049bb133111eb);
    x ^= x >> 31;
    let mut s = x as usize & mask;
    while counts[s] != 0 && keys[s] != key {
        s = (s + 1) & mask;
    }
    s
}

/// Count the entries of one partition, whose elements lie in `[start, end)`,
/// and replace each entry's key by its table slot.
fn count_partition(entries: &mut [Entry], start: u128, end: u128) -> PartCount {
    let span = end.saturating_sub(start);
    if span <= (entries.len().max(1024) as u128) * DIRECT_SPAN_PER_ENTRY as u128 {
        let base = start as u64;
        let mut table = vec![0u32; span as usize];
        for e in entries.iter_mut() {
            let slot = e.key - base;
            table[slot as usize] += 1;
            e.key = slot;
        }
        let distinct = (0..span as usize).filter(|&v| table[v] != 0).map(|v| (base + v as u64, v)).collect();
        return PartCount { table, distinct };
    }
    let cap = (entries.len() * 2).next_power_of_two().max(16);
    let mut keys = vec![0u64; cap];
    let mut table = vec![0u32; cap];
    for e in entries.iter_mut() {
        let s = hash_slot(&keys, &table, e.key);
        keys[s] = e.key;
        table[s] += 1;
        e.key = s as u64;
    }
    let mut distinct: Vec<(u64, usize)> = (0..cap).filter(|&s| table[s] != 0).map(|s| (keys[s], s)).collect();
    distinct.sort_unstable();
    PartCount { table, distinct }
}

/// Sets ordered by (size, id): a stable counting sort by size. Returns the
/// order and the output offsets (one past each set's tokens, from 0).
fn order_by_size(sizes: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let max = sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut next = vec![0u32; max + 2];
    for &z in sizes {
        next[z as usize + 1] += 1;
    }
    for z in 1..next.len() {
        next[z] += next[z - 1];
    }
    let mut perm = vec![0u32; sizes.len()];
    for (i, &z) in sizes.iter().enumerate() {
        perm[next[z as usize] as usize] = i as u32;
        next[z as usize] += 1;
    }
    let mut offsets = Vec::with_capacity(sizes.len() + 1);
    offsets.push(0u32);
    let mut at = 0u32;
    for &i in &perm {
        at += sizes[i as usize];
        offsets.push(at);
    }
    (perm, offsets)
}

/// The output layout of one collection: its set order, offsets, and the
/// position (in the concatenated output tokens) of each input set's first token.
struct Layout {
    perm: Vec<u32>,
    offsets: Vec<u32>,
    first: Vec<u32>,
}

fn layouts(sizes: &[Vec<u32>]) -> Vec<Layout> {
    let mut base = 0u64;
    sizes
        .iter()
        .map(|sz| {
            let (perm, offsets) = order_by_size(sz);
            let total = *offsets.last().unwrap_or(&0) as u64;
            assert!(base + total < u32::MAX as u64, "similarity join: more than 2^32 set elements");
            let mut first = vec![0u32; sz.len()];
            for (p, &i) in perm.iter().enumerate() {
                first[i as usize] = base as u32 + offsets[p];
            }
            base += total;
            Layout { perm, offsets, first }
        })
        .collect()
}

/// The output tokens of one or two collections (concatenated, in their
/// layouts' order) cut into the collections, as both backends return them.
fn into_collections(layouts: Vec<Layout>, mut tokens: Vec<u32>, vocab: u32) -> (SetCollection, Option<SetCollection>) {
    let r_len = layouts[0].offsets.last().map_or(0, |&n| n as usize);
    let s_tokens = tokens.split_off(r_len);
    let two = layouts.len() > 1;
    let mut layouts = layouts.into_iter();
    let mut take = |tokens: Vec<u32>| {
        let l = layouts.next().expect("one layout per collection");
        SetCollection::from_parts(l.offsets, tokens, l.perm, vocab)
    };
    let rc = take(tokens);
    let sc = two.then(|| take(s_tokens));
    (rc, sc)
}

/// Frequencies of elements listed in element order become, in place, the
/// elements' ranks in ascending (frequency, element) order (a stable counting
/// sort by frequency); zeros (no element) stay. Returns the elements' number.
fn rank_in_place(freqs: &mut [u32]) -> u32 {
    let max = freqs.iter().copied().max().unwrap_or(0) as usize;
    let mut next = vec![0u32; max + 1];
    for &f in freqs.iter() {
        if f > 0 {
            next[f as usize] += 1;
        }
    }
    let mut at = 0u32;
    for slot in next.iter_mut() {
        let n = *slot;
        *slot = at;
        at += n;
    }
    for f in freqs.iter_mut().filter(|f| **f > 0) {
        let rank = next[*f as usize];
        next[*f as usize] += 1;
        *f = rank;
    }
    at
}

/// Preprocess one or two collections with one shared token order (see the
/// module documentation), on all host cores. `s = None` is a self join of `r`.
pub fn preprocess(r: &RawSets, s: Option<&RawSets>) -> (SetCollection, Option<SetCollection>) {
    preprocess_with(r, s, default_threads())
}

/// [`preprocess`] in about `threads` tasks per pass (on the host copy pool).
///
/// 1. per chunk of sets: sort and deduplicate each set, min / max;
/// 2. the sets' output order (counting sort by size) and each set's output
///    position; per chunk, a histogram of fine buckets (high bits of
///    `element - min`), from which contiguous runs of fine buckets become
///    partitions of about equal size, so partitions are element ranges in
///    ascending order;
/// 3. per chunk: each element goes, with its output position, to its
///    partition (a counting-sort scatter into one array);
/// 4. per partition: count the elements (direct table for dense keys, hash
///    table otherwise); the partitions' distinct elements, concatenated, are
///    in element order, so one stable counting sort by frequency ranks them;
/// 5. per partition: write each occurrence's rank at its output position;
/// 6. per chunk of output sets: sort each set's tokens.
pub fn preprocess_with(r: &RawSets, s: Option<&RawSets>, threads: usize) -> (SetCollection, Option<SetCollection>) {
    let colls: Vec<&RawSets> = std::iter::once(r).chain(s).collect();
    let total: usize = colls.iter().map(|c| c.elems.len()).sum();
    let tasks = (total / ELEMS_PER_TASK).clamp(1, 4 * threads.max(1));

    // 1. Sort and deduplicate, by chunks of sets.
    let mut chunks: Vec<Chunk> = Vec::new();
    for (coll, c) in colls.iter().enumerate() {
        let pieces = (tasks * c.elems.len()).div_ceil(total.max(1)).clamp(1, c.len().max(1));
        let per = c.len().div_ceil(pieces).max(1);
        for a in (0..c.len()).step_by(per) {
            chunks.push(Chunk {
                coll,
                sets: a..(a + per).min(c.len()),
                elems: Vec::new(),
                sizes: Vec::new(),
                min: u64::MAX,
                max: 0,
                fine: Vec::new(),
            });
        }
    }
    for_each_mut(&mut chunks, &|_, ch| {
        let raw = colls[ch.coll];
        let sets = ch.sets.clone();
        ch.elems.reserve(raw.offsets[sets.end] - raw.offsets[sets.start]);
        ch.sizes.reserve(sets.len());
        for i in sets {
            let start = ch.elems.len();
            ch.elems.extend_from_slice(raw.set(i));
            let kept = sort_dedup(&mut ch.elems[start..]);
            ch.elems.truncate(start + kept);
            ch.sizes.push(kept as u32);
            if kept > 0 {
                ch.min = ch.min.min(ch.elems[start]);
                ch.max = ch.max.max(ch.elems[start + kept - 1]);
            }
        }
    });

    // 2. Output layout of each collection, and the partitions.
    let sizes: Vec<Vec<u32>> = (0..colls.len())
        .map(|k| chunks.iter().filter(|c| c.coll == k).flat_map(|c| c.sizes.iter().copied()).collect())
        .collect();
    let layouts = layouts(&sizes);
    let distinct_total: usize = chunks.iter().map(|c| c.elems.len()).sum();
    let lo = chunks.iter().map(|c| c.min).min().unwrap_or(u64::MAX);
    let hi = chunks.iter().map(|c| c.max).max().unwrap_or(0);
    let mut tokens = vec![0u32; distinct_total];
    let mut vocab = 0;
    if distinct_total > 0 {
        let fine = FineBuckets::new(lo, hi);
        for_each_mut(&mut chunks, &|_, ch| {
            ch.fine = vec![0u32; 1 << FINE_BITS];
            for &e in &ch.elems {
                ch.fine[fine.of(e)] += 1;
            }
        });
        let buckets = fine.of(hi) + 1;
        let mut per_bucket = vec![0usize; buckets];
        for ch in &chunks {
            for (b, &n) in ch.fine[..buckets].iter().enumerate() {
                per_bucket[b] += n as usize;
            }
        }
        // Partition p takes fine buckets cuts[p]..cuts[p + 1].
        let parts = tasks.min(buckets);
        let mut cuts = vec![0usize];
        let mut seen = 0usize;
        for (b, &n) in per_bucket.iter().enumerate() {
            seen += n;
            if cuts.len() < parts && seen * parts >= cuts.len() * distinct_total && b + 1 < buckets {
                cuts.push(b + 1);
            }
        }
        cuts.push(buckets);
        let parts = cuts.len() - 1;
        let mut part_of = vec![0u32; buckets];
        for p in 0..parts {
            part_of[cuts[p]..cuts[p + 1]].fill(p as u32);
        }

        // 3. Scatter: partition-major, chunk order within a partition.
        let counts: Vec<Vec<usize>> = chunks
            .iter()
            .map(|ch| (0..parts).map(|p| ch.fine[cuts[p]..cuts[p + 1]].iter().map(|&n| n as usize).sum()).collect())
            .collect();
        let mut entries = vec![Entry::default(); distinct_total];
        let mut part_ranges = Vec::with_capacity(parts);
        let mut jobs: Vec<(usize, Vec<&mut [Entry]>)> =
            (0..chunks.len()).map(|c| (c, Vec::with_capacity(parts))).collect();
        {
            let mut rest: &mut [Entry] = &mut entries;
            let mut at = 0;
            for p in 0..parts {
                let start = at;
                for (c, job) in jobs.iter_mut().enumerate() {
                    let (mine, tail) = std::mem::take(&mut rest).split_at_mut(counts[c][p]);
                    job.1.push(mine);
                    rest = tail;
                    at += counts[c][p];
                }
                part_ranges.push(start..at);
            }
        }
        for_each_mut(&mut jobs, &|_, (c, slices)| {
            let ch = &chunks[*c];
            let first = &layouts[ch.coll].first;
            let mut cursor = vec![0usize; slices.len()];
            let mut at = 0;
            for (i, &size) in ch.sets.clone().zip(&ch.sizes) {
                let set = &ch.elems[at..at + size as usize];
                at += size as usize;
                for (j, &e) in set.iter().enumerate() {
                    let p = part_of[fine.of(e)] as usize;
                    slices[p][cursor[p]] = Entry { key: e, pos: first[i] + j as u32 };
                    cursor[p] += 1;
                }
            }
        });
        drop(jobs);

        // 4. Count per partition, then rank all distinct elements.
        let mut part_entries: Vec<(&mut [Entry], Range<u128>, Option<PartCount>)> = Vec::with_capacity(parts);
        {
            let mut rest: &mut [Entry] = &mut entries;
            for p in 0..parts {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(part_ranges[p].len());
                rest = tail;
                let end = if p + 1 == parts { hi as u128 + 1 } else { fine.start(cuts[p + 1]) };
                part_entries.push((mine, fine.start(cuts[p])..end, None));
            }
        }
        for_each_mut(&mut part_entries, &|_, (ent, range, out)| {
            *out = Some(count_partition(ent, range.start, range.end))
        });
        let mut counted: Vec<(&mut [Entry], PartCount)> =
            part_entries.into_iter().map(|(e, _, c)| (e, c.expect("every partition is counted"))).collect();
        let mut ranks: Vec<u32> =
            counted.iter().flat_map(|(_, c)| c.distinct.iter().map(|&(_, s)| c.table[s])).collect();
        vocab = rank_in_place(&mut ranks);
        let mut next = ranks.into_iter();
        for (_, c) in counted.iter_mut() {
            for &(_, slot) in &c.distinct {
                c.table[slot] = next.next().expect("one rank per distinct element");
            }
        }

        // 5. Each occurrence's rank to its output position.
        // Every task writes anywhere in the tokens, each position once (set i's j-th distinct
        // element is the only one at first[i] + j): relaxed atomic stores, plain stores on
        // x86, and the vectors convert in place (the same layout).
        let sink: Vec<AtomicU32> = std::mem::take(&mut tokens).into_iter().map(AtomicU32::new).collect();
        for_each_mut(&mut counted, &|_, (ent, c)| {
            for e in ent.iter() {
                sink[e.pos as usize].store(c.table[e.key as usize], Ordering::Relaxed);
            }
        });
        tokens = sink.into_iter().map(AtomicU32::into_inner).collect();
    }

    // 6. Sort each output set's tokens; build the collections.
    let mut out_sets: Vec<(&mut [u32], &[u32])> = Vec::new();
    {
        let mut rest: &mut [u32] = &mut tokens;
        for l in &layouts {
            let n = l.perm.len();
            let per = n.div_ceil(tasks.div_ceil(layouts.len())).max(1);
            for a in (0..n).step_by(per) {
                let b = (a + per).min(n);
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut((l.offsets[b] - l.offsets[a]) as usize);
                rest = tail;
                out_sets.push((mine, &l.offsets[a..=b]));
            }
        }
    }
    for_each_mut(&mut out_sets, &|_, (toks, offs)| {
        let base = offs[0];
        for w in offs.windows(2) {
            toks[(w[0] - base) as usize..(w[1] - base) as usize].sort_unstable();
        }
    });
    drop(out_sets);
    into_collections(layouts, tokens, vocab)
}

// ---------------------------------------------------------------------------
// Device path (kernels/ssjoin_prep.cu)
// ---------------------------------------------------------------------------

/// Sets of at most this many raw elements are sorted by one thread each
/// (`PREP_SMALL` in the kernels).
const SMALL_SET: usize = 64;
/// The most raw elements of a set the device sorts: one block's shared
/// memory (`PREP_LARGE`); a larger set sends the inputs to the host twin.
const LARGE_SET: usize = 4096;
/// Threads per block of the one-block-per-set kernels (`PREP_BLOCK`).
const LARGE_BLOCK: u32 = 256;
/// Threads per block of the one-thread-per-set kernels (their sort buffer
/// is 512 bytes of local memory per thread).
const SMALL_BLOCK: u32 = 128;
/// The device counts frequencies in a table over the key range `[min, max]`,
/// which comes to the host and goes back as ranks: up to this many table
/// entries per raw element (4 bytes each, against the element's 8 bytes of
/// upload), or [`MIN_SPAN_CAP`]. Strings' dictionary ids and dense integer
/// ids fit; sparse keys are left to the host twin.
const SPAN_PER_ELEMENT: u64 = 2;
const MIN_SPAN_CAP: u64 = 1 << 20;
/// Below this many raw elements the host twin takes the inputs: the device
/// path's fixed cost (six launches, three synchronisations, five transfers)
/// is a few hundred microseconds, the host's work about 10 ns per element
/// and core. Not yet measured on the GPU machine (`bench ssjoin` reports both).
pub const DEVICE_MIN_ELEMENTS: usize = 1 << 17;

/// Inputs the device path takes: the sets of both collections back to back,
/// every element in `[lo, lo + span)`.
pub struct DeviceInput<'a> {
    colls: Vec<&'a RawSets>,
    lo: u64,
    span: u64,
}

impl std::fmt::Debug for DeviceInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceInput(lo {}, span {})", self.lo, self.span)
    }
}

/// The elements of `c`'s sets (a `RawSets` may hold elements before its first set).
fn set_elems(c: &RawSets) -> &[u64] {
    match c.len() {
        0 => &[],
        n => &c.elems[c.offsets[0]..c.offsets[n]],
    }
}

/// The inputs as the device path takes them, or why it does not (then the
/// host twin runs): fewer than `min_elements` elements, a set of more than
/// [`LARGE_SET`] elements, or a key range too wide for the frequency table.
pub fn device_input<'a>(
    r: &'a RawSets,
    s: Option<&'a RawSets>,
    min_elements: usize,
) -> std::result::Result<DeviceInput<'a>, String> {
    let colls: Vec<&RawSets> = std::iter::once(r).chain(s).collect();
    let total: usize = colls.iter().map(|c| set_elems(c).len()).sum();
    if total < min_elements.max(1) {
        return Err(format!("{total} set elements: the host is faster below {min_elements}"));
    }
    if total as u64 >= u32::MAX as u64 || colls.iter().map(|c| c.len()).sum::<usize>() as u64 >= u32::MAX as u64 {
        return Err("more than 2^32 sets or set elements".into());
    }
    if let Some(n) = colls.iter().flat_map(|c| c.offsets.windows(2).map(|w| w[1] - w[0])).find(|&n| n > LARGE_SET) {
        return Err(format!("a set of {n} elements (the device sorts at most {LARGE_SET})"));
    }
    let pieces: Vec<&[u64]> = colls.iter().flat_map(|c| set_elems(c).chunks(ELEMS_PER_TASK)).collect();
    let ranges = crate::host::par_map(&pieces, 4, |p| {
        Ok::<_, ()>(p.iter().fold((u64::MAX, 0u64), |(lo, hi), &e| (lo.min(e), hi.max(e))))
    })
    .unwrap_or_default();
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let cap = (total as u64).saturating_mul(SPAN_PER_ELEMENT).max(MIN_SPAN_CAP);
    if hi - lo >= cap {
        return Err(format!("key range {} wider than {cap} (the frequency table's limit)", hi - lo + 1));
    }
    Ok(DeviceInput { colls, lo, span: hi - lo + 1 })
}

/// Grid of a grid-stride launch over `n` items, `per_block` a block: enough
/// blocks to fill the device, no more than the items need.
fn grid(gpu: &Gpu, n: usize, per_block: u32, blocks_per_sm: u32) -> LaunchConfig {
    let sms = gpu.info().multiprocessors.max(1) as u32;
    let blocks = n.div_ceil(per_block as usize).min((sms * blocks_per_sm) as usize).max(1) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (per_block, 1, 1), shared_mem_bytes: 0 }
}

/// [`preprocess`] on the device (kernels/ssjoin_prep.cu), the same
/// collections. The caller holds the device lock and has set the memory
/// budget. Host <-> device: the raw elements go up (frame-of-reference
/// packed) with the set offsets; the frequency table and the distinct sizes
/// come down; ranks and output positions go up; the tokens come down.
pub fn preprocess_gpu(
    gpu: &Gpu,
    input: &DeviceInput,
    ts: &mut TransferStats,
) -> Result<(SetCollection, Option<SetCollection>)> {
    let stream = gpu.stream();
    let colls = &input.colls;
    let n_sets: usize = colls.iter().map(|c| c.len()).sum();
    let mut offs: Vec<u64> = Vec::with_capacity(n_sets + 1);
    offs.push(0);
    let mut chunks: Vec<&[u64]> = Vec::with_capacity(colls.len());
    for c in colls {
        if c.is_empty() {
            continue;
        }
        let (first, base) = (c.offsets[0], *offs.last().unwrap_or(&0));
        offs.extend(c.offsets[1..].iter().map(|&o| base + (o - first) as u64));
        chunks.push(set_elems(c));
    }
    let large: Vec<u32> = (0..n_sets).filter(|&i| offs[i + 1] - offs[i] > SMALL_SET as u64).map(|i| i as u32).collect();
    let (elems, _) = gpu.upload_keys_each(&chunks, ts, false, &mut |_, _| Ok(()))?;
    let d_offs = gpu.upload(&offs, ts)?;
    let d_large = gpu.upload(&large, ts)?;
    let span = input.span as usize;
    let df = gpu.alloc_zeros::<u32>(span)?;
    let sizes = gpu.alloc::<u32>(n_sets)?;
    let (n, n_large, lo) = (n_sets as u64, large.len() as u64, input.lo);

    // 1. Sort, deduplicate, count document frequencies.
    let started = Instant::now();
    let f = gpu.function(&KERNEL, "dedup_count_small")?;
    let mut b = stream.launch_builder(&f);
    b.arg(&elems.slice).arg(&d_offs.slice).arg(&n).arg(&lo).arg(&df.slice).arg(&sizes.slice);
    // SAFETY: the arguments match kernels/ssjoin_prep.cu dedup_count_small; offs has n + 1 entries into elems; every
    // element lies in [lo, lo + span), the length of df; sizes has n entries.
    unsafe { b.launch(grid(gpu, n_sets, SMALL_BLOCK, 16)) }
        .map_err(|e| cuda_err("ssjoin_prep dedup_count_small", e))?;
    if !large.is_empty() {
        let f = gpu.function(&KERNEL, "dedup_count_large")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&elems.slice)
            .arg(&d_offs.slice)
            .arg(&d_large.slice)
            .arg(&n_large)
            .arg(&lo)
            .arg(&df.slice)
            .arg(&sizes.slice);
        // SAFETY: as above; `large` lists sets of at most LARGE_SET (= PREP_LARGE) elements (checked by device_input).
        unsafe { b.launch(grid(gpu, large.len() * LARGE_BLOCK as usize, LARGE_BLOCK, 8)) }
            .map_err(|e| cuda_err("ssjoin_prep dedup_count_large", e))?;
    }
    gpu.synchronize()?;
    ts.kernel += started.elapsed();

    // 2. Ranks, set order and output positions on the host.
    let mut ranks = gpu.download(&df, span, ts)?;
    let distinct_sizes = gpu.download(&sizes, n_sets, ts)?;
    let vocab = rank_in_place(&mut ranks);
    let mut per_coll = Vec::with_capacity(colls.len());
    let mut at = 0;
    for c in colls {
        per_coll.push(distinct_sizes[at..at + c.len()].to_vec());
        at += c.len();
    }
    let layouts = layouts(&per_coll);
    let dst: Vec<u32> = layouts.iter().flat_map(|l| l.first.iter().copied()).collect();
    let total: usize = layouts.iter().map(|l| l.offsets.last().map_or(0, |&n| n as usize)).sum();
    let tokens = if total == 0 {
        Vec::new()
    } else {
        let d_ranks = gpu.upload(&ranks, ts)?;
        let d_dst = gpu.upload(&dst, ts)?;
        let d_tokens = gpu.alloc::<u32>(total)?;

        // 3. Tokens: ranks, sorted per set, at their output positions.
        let started = Instant::now();
        let f = gpu.function(&KERNEL, "map_small")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&elems.slice).arg(&d_offs.slice).arg(&n).arg(&sizes.slice).arg(&lo).arg(&d_ranks.slice).arg(&d_dst.slice);
        b.arg(&d_tokens.slice);
        // SAFETY: the arguments match map_small; ranks covers the key range; each set's sizes[i] tokens at dst[i]
        // lie inside tokens (dst and the sizes come from the same layout, whose total is its length).
        unsafe { b.launch(grid(gpu, n_sets, SMALL_BLOCK, 16)) }.map_err(|e| cuda_err("ssjoin_prep map_small", e))?;
        if !large.is_empty() {
            let f = gpu.function(&KERNEL, "map_large")?;
            let mut b = stream.launch_builder(&f);
            b.arg(&elems.slice).arg(&d_offs.slice).arg(&d_large.slice).arg(&n_large).arg(&sizes.slice).arg(&lo);
            b.arg(&d_ranks.slice).arg(&d_dst.slice).arg(&d_tokens.slice);
            // SAFETY: as for map_small; listed sets have at most LARGE_SET (= PREP_LARGE) elements.
            unsafe { b.launch(grid(gpu, large.len() * LARGE_BLOCK as usize, LARGE_BLOCK, 8)) }
                .map_err(|e| cuda_err("ssjoin_prep map_large", e))?;
        }
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        gpu.download(&d_tokens, total, ts)?
    };
    Ok(into_collections(layouts, tokens, vocab))
}

/// Preprocessing for the GPU backend: on the device when [`device_input`]
/// takes the inputs (at least [`DEVICE_MIN_ELEMENTS`]) and the device run
/// succeeds, on the host otherwise. Returns the collections and where they
/// were built, for EXPLAIN ANALYZE.
pub fn preprocess_for_gpu(
    gpu: &Gpu,
    r: &RawSets,
    s: Option<&RawSets>,
    ts: &mut TransferStats,
) -> ((SetCollection, Option<SetCollection>), String) {
    match device_input(r, s, DEVICE_MIN_ELEMENTS) {
        Err(why) => (preprocess(r, s), format!("preprocessed on the host: {why}")),
        Ok(input) => match preprocess_gpu(gpu, &input, ts) {
            Ok(c) => (c, "preprocessed on the device".into()),
            Err(e) => (preprocess(r, s), format!("preprocessed on the host: device failed: {e}")),
        },
    }
}

/// Doctor self-check: the device path against the CPU twin on random
/// collections (dense and skewed keys, duplicates, empty sets, sets past
/// one thread's sort), self and two-collection preprocessing.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut random_sets = |n: usize, universe: u64, max_size: usize| {
        let mut raw = RawSets::new();
        for _ in 0..n {
            let k =
                if rng.random_range(0..50) == 0 { rng.random_range(0..=max_size) } else { rng.random_range(0..=40) };
            let set: Vec<u64> = (0..k)
                .map(|_| (rng.random_range(0..universe) * rng.random_range(0..universe)) / universe + 1000)
                .collect();
            raw.push(set);
        }
        raw
    };
    let cases = [
        ("small", random_sets(300, 60, 20), random_sets(200, 60, 20)),
        ("large sets", random_sets(2000, 5000, LARGE_SET), random_sets(1500, 5000, 300)),
    ];
    let mut checked = 0;
    for (name, a, b) in &cases {
        for s in [None, Some(b)] {
            let input = device_input(a, s, 0)
                .map_err(|why| DataFusionError::Internal(format!("ssjoin_prep self-check: {why}")))?;
            let got = preprocess_gpu(gpu, &input, &mut TransferStats::default())?;
            if got != preprocess(a, s) {
                return Err(DataFusionError::Execution(format!(
                    "ssjoin_prep self-check failed on {name} ({}): device and host collections differ",
                    if s.is_some() { "two collections" } else { "self join" }
                )));
            }
            checked += 1;
        }
    }
    Ok(format!("{checked} preprocessings match the CPU twin"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// The former single-threaded preprocessing, the reference for both twins.
    fn preprocess_reference(r: &RawSets, s: Option<&RawSets>) -> (SetCollection, Option<SetCollection>) {
        let rd = dedup_sets(r);
        let sd = s.map(dedup_sets);
        let mut freq: HashMap<u64, u32> = HashMap::new();
        for e in rd.elems.iter().chain(sd.iter().flat_map(|s| s.elems.iter())) {
            *freq.entry(*e).or_insert(0) += 1;
        }
        let mut order: Vec<(u32, u64)> = freq.iter().map(|(e, f)| (*f, *e)).collect();
        order.sort_unstable();
        for (rank, (_, e)) in order.iter().enumerate() {
            *freq.get_mut(e).unwrap() = rank as u32;
        }
        let build = |d: &RawSets| -> SetCollection {
            let n = d.len();
            let mut perm: Vec<u32> = (0..n as u32).collect();
            perm.sort_by_key(|&i| (d.offsets[i as usize + 1] - d.offsets[i as usize], i));
            let mut offsets = vec![0u32];
            let mut tokens = Vec::new();
            for &i in &perm {
                let start = tokens.len();
                tokens.extend(d.set(i as usize).iter().map(|e| freq[e]));
                tokens[start..].sort_unstable();
                offsets.push(tokens.len() as u32);
            }
            SetCollection::from_parts(offsets, tokens, perm, order.len() as u32)
        };
        (build(&rd), sd.as_ref().map(build))
    }

    /// `n` sets of sizes `0..=max_size` drawn from `draw` (duplicates inside
    /// sets and empty sets included).
    fn random_sets(rng: &mut StdRng, n: usize, max_size: usize, mut draw: impl FnMut(&mut StdRng) -> u64) -> RawSets {
        let mut r = RawSets::new();
        for _ in 0..n {
            let k = rng.random_range(0..=max_size);
            let set: Vec<u64> = (0..k).map(|_| draw(rng)).collect();
            r.push(set);
        }
        r
    }

    /// Collections whose keys are dense, sparse (hashed partitions), skewed,
    /// at the ends of the u64 range, or all equal.
    pub(crate) fn key_shapes(n: usize, seed: u64) -> Vec<(&'static str, RawSets, RawSets)> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut shapes = Vec::new();
        let mut both = |name: &'static str, max_size: usize, draw: &dyn Fn(&mut StdRng) -> u64| {
            let a = random_sets(&mut rng, n, max_size, draw);
            let b = random_sets(&mut rng, n / 2 + 1, max_size, draw);
            shapes.push((name, a, b));
        };
        both("dense", 40, &|g| g.random_range(0..5_000));
        both("tiny universe", 12, &|g| g.random_range(0..6));
        both("sparse", 40, &|g| g.random::<u64>() >> g.random_range(0..40));
        both("extremes", 20, &|g| {
            if g.random_bool(0.5) {
                u64::MAX - g.random_range(0..50)
            } else {
                g.random_range(0..50)
            }
        });
        both("one element", 8, &|_| 77);
        both("skewed", 60, &|g| {
            let u: f64 = g.random();
            (u * u * u * 30_000.0) as u64 * 1_000_003
        });
        both("large sets", 3000, &|g| g.random_range(0..20_000));
        shapes
    }

    #[test]
    fn matches_reference_on_random_collections() {
        for (name, a, b) in key_shapes(700, 3) {
            for threads in [1, 2, 5, 16] {
                let want = preprocess_reference(&a, Some(&b));
                assert_eq!(preprocess_with(&a, Some(&b), threads), want, "{name}: two collections, {threads} threads");
                let want = preprocess_reference(&a, None);
                assert_eq!(preprocess_with(&a, None, threads), want, "{name}: self join, {threads} threads");
            }
        }
        // Empty inputs and only empty sets.
        let empty = RawSets::new();
        let blanks = RawSets::from_vecs(&[vec![], vec![], vec![]]);
        let some = RawSets::from_vecs(&[vec![3, 1, 3], vec![], vec![1]]);
        for (a, b) in
            [(&empty, None), (&blanks, None), (&empty, Some(&some)), (&some, Some(&empty)), (&blanks, Some(&blanks))]
        {
            assert_eq!(preprocess(a, b), preprocess_reference(a, b), "{a:?} {b:?}");
        }
    }

    /// Many tasks and partitions: inputs past one task's worth of elements.
    #[test]
    fn matches_reference_on_large_collections() {
        let a = crate::algo::ssjoin::reference::generate(20_000, true, 5);
        let b = crate::algo::ssjoin::reference::generate(15_000, false, 6);
        for threads in [3, 16] {
            assert_eq!(preprocess_with(&a, Some(&b), threads), preprocess_reference(&a, Some(&b)), "{threads} threads");
            assert_eq!(preprocess_with(&b, None, threads), preprocess_reference(&b, None), "{threads} threads");
        }
    }

    /// The device path equals the CPU twin: the doctor's check, every key
    /// shape the device takes (the others must be declined for a reason),
    /// and the benchmark's 100k-set collections, self and two collections.
    /// Skips without a GPU unless SETFUSION_REQUIRE_GPU=1.
    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let gpu = gpu.lease(0);
        println!("{}", self_check(&gpu).unwrap());
        let mut shapes = key_shapes(700, 9);
        shapes.push((
            "bench",
            crate::algo::ssjoin::reference::generate(100_000, true, 1),
            crate::algo::ssjoin::reference::generate(50_000, false, 2),
        ));
        let mut on_device = 0;
        for (name, a, b) in &shapes {
            for s in [None, Some(b)] {
                let what = format!("{name}, {}", if s.is_some() { "two collections" } else { "self join" });
                match device_input(a, s, 0) {
                    Ok(input) => {
                        let got = preprocess_gpu(&gpu, &input, &mut TransferStats::default())
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(got, preprocess_reference(a, s), "{what}");
                        on_device += 1;
                    }
                    Err(why) => println!("{what}: declined: {why}"),
                }
            }
        }
        assert!(on_device >= 8, "only {on_device} inputs went to the device");
        // Under a memory budget too small for the frequency table: an error, never a wrong answer.
        gpu.budget().set_limit(1 << 16);
        let (_, a, _) = &shapes[shapes.len() - 1];
        let input = device_input(a, None, 0).unwrap();
        assert!(preprocess_gpu(&gpu, &input, &mut TransferStats::default()).is_err());
    }

    #[test]
    fn device_input_declines_what_the_kernels_do_not_take() {
        let small = RawSets::from_vecs(&[vec![1, 2, 3], vec![2, 2]]);
        assert!(device_input(&small, None, 0).is_ok());
        assert!(device_input(&small, None, 100).unwrap_err().contains("host is faster"));
        let huge_set = RawSets::from_vecs(&[(0..LARGE_SET as u64 + 1).collect()]);
        assert!(device_input(&huge_set, None, 0).unwrap_err().contains("a set of"));
        let sparse = RawSets::from_vecs(&[vec![0, 1 << 40]]);
        assert!(device_input(&sparse, Some(&small), 0).unwrap_err().contains("key range"));
        assert!(device_input(&RawSets::new(), Some(&RawSets::new()), 0).is_err());
        let (r, s) = (RawSets::from_vecs(&[vec![7, 9]]), RawSets::from_vecs(&[vec![5]]));
        let input = device_input(&r, Some(&s), 0).unwrap();
        assert_eq!((input.lo, input.span), (5, 5));
    }

    /// Preprocessing time on the benchmark's 100k-set collections: the
    /// reference (single-threaded) and the CPU twin on all cores, and the
    /// device path when there is a GPU.
    /// `cargo test --release --lib preprocess_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn preprocess_timing() {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let best = |f: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .min()
                .unwrap()
        };
        for (name, zipf, seed) in [("UNIFORM-100k", false, 11 + 100_000), ("ZIPF-100k", true, 13 + 100_000)] {
            let raw = crate::algo::ssjoin::reference::generate(100_000, zipf, seed);
            let reference = best(&mut || drop(std::hint::black_box(preprocess_reference(&raw, None))));
            let twin = best(&mut || drop(std::hint::black_box(preprocess(&raw, None))));
            let device = match crate::gpu::gpu(0) {
                Ok(gpu) => {
                    let _lock = gpu.lock_blocking();
                    let input = device_input(&raw, None, 0).unwrap();
                    let mut run = || {
                        drop(std::hint::black_box(preprocess_gpu(&gpu, &input, &mut TransferStats::default()).unwrap()))
                    };
                    run();
                    format!("{:.1} ms", ms(best(&mut run)))
                }
                Err(e) => format!("not run ({e})"),
            };
            eprintln!(
                "{name}: reference {:.1} ms, CPU twin {:.1} ms on {} threads, device {device}",
                ms(reference),
                ms(twin),
                default_threads()
            );
        }
    }
}
