//! The CPU twin of every selection strategy: per key, a hash map of (build
//! count, probe rank), radix-partitioned by key hash over the host threads.

use std::collections::HashMap;

use datafusion::arrow::buffer::BooleanBuffer;

use super::{words_to_bool, SetOp};

/// CPU twin: same rules, a hash map of (build count, probe rank) per key.
pub fn select_cpu(op: SetOp, build: &[u64], probe: &[u64]) -> BooleanBuffer {
    select_cpu_chunks(op, &[build], &[probe])
}

/// Multiply-xorshift hasher for 64-bit keys: SipHash (std's default) costs
/// more than the whole probe on these tables.
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
        self.0 ^ (self.0 >> 29)
    }
}

pub(super) type KeyMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// The rules over one partition: `probe` yields (row, key) in row order;
/// `build_len` sizes the table up front.
pub(super) fn select_serial(
    op: SetOp,
    build: impl Iterator<Item = u64>,
    build_len: usize,
    probe: impl Iterator<Item = (usize, u64)>,
    mut set: impl FnMut(usize),
) {
    match op {
        SetOp::Semi | SetOp::Anti => {
            let mut keys: std::collections::HashSet<u64, std::hash::BuildHasherDefault<KeyHasher>> =
                std::collections::HashSet::with_capacity_and_hasher(build_len, Default::default());
            keys.extend(build);
            let want = op == SetOp::Semi;
            for (i, k) in probe {
                if keys.contains(&k) == want {
                    set(i);
                }
            }
        }
        _ => {
            let mut counts: KeyMap<(u32, u32)> = KeyMap::with_capacity_and_hasher(build_len, Default::default());
            for k in build {
                counts.entry(k).or_default().0 += 1;
            }
            for (i, k) in probe {
                let e = counts.entry(k).or_default();
                let (n, r) = (e.0, e.1);
                e.1 += 1;
                let keep = match op {
                    SetOp::IntersectAll => r < n,
                    SetOp::IntersectDistinct => n > 0 && r == 0,
                    SetOp::ExceptAll => r >= n,
                    SetOp::ExceptDistinct => n == 0 && r == 0,
                    SetOp::Semi | SetOp::Anti => unreachable!(),
                };
                if keep {
                    set(i);
                }
            }
        }
    }
}

/// Radix partitions of the parallel CPU selection: many more than threads, so
/// each partition's table stays near the cache and the pool balances them.
pub(super) const CPU_PART_BITS: u32 = 8;
/// Keys per partitioning task.
pub(super) const CPU_PIECE: usize = 1 << 20;

/// Split chunks into pieces of at most [`CPU_PIECE`] keys, each with its first row.
pub(super) fn pieces<'a>(chunks: &[&'a [u64]]) -> Vec<(usize, &'a [u64])> {
    let mut out = Vec::new();
    let mut at = 0;
    for c in chunks {
        for piece in c.chunks(CPU_PIECE) {
            out.push((at, piece));
            at += piece.len();
        }
    }
    out
}

/// Every piece's keys split into `parts` buckets by `part`, on the host
/// threads: `out[piece][partition]`, each in the piece's order.
pub(super) fn bucket_keys(
    pieces: &[(usize, &[u64])],
    parts: usize,
    part: impl Fn(u64) -> usize + Sync,
) -> Vec<Vec<Vec<u64>>> {
    let Ok(buckets): Result<Vec<Vec<Vec<u64>>>, std::convert::Infallible> =
        crate::host::par_map(pieces, 1, |(_, keys)| {
            let mut b: Vec<Vec<u64>> = (0..parts).map(|_| Vec::with_capacity(keys.len() / parts * 2)).collect();
            for &k in *keys {
                b[part(k)].push(k);
            }
            Ok(b)
        });
    buckets
}

/// [`select_cpu`] over keys given in chunks (read back to back), on the host
/// copy threads: every piece of keys is radix-partitioned by hash in parallel,
/// then each partition applies the rule on its own, reading its probe keys in
/// row order (piece by piece), which the ranks of the ALL rules need.
pub fn select_cpu_chunks(op: SetOp, build_chunks: &[&[u64]], probe_chunks: &[&[u64]]) -> BooleanBuffer {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};
    let probe_len: usize = probe_chunks.iter().map(|c| c.len()).sum();
    let build_len: usize = build_chunks.iter().map(|c| c.len()).sum();
    if crate::host::copy_threads() == 1 || probe_len + build_len < (1 << 16) {
        let mut words = vec![0u32; probe_len.div_ceil(32)];
        let build = build_chunks.iter().flat_map(|c| c.iter().copied());
        let probe = probe_chunks.iter().flat_map(|c| c.iter().copied()).enumerate();
        select_serial(op, build, build_len, probe, |i| words[i >> 5] |= 1 << (i & 31));
        return words_to_bool(words, probe_len);
    }
    let parts = 1usize << CPU_PART_BITS;
    let part = |k: u64| (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CPU_PART_BITS)) as usize;
    let build_buckets = bucket_keys(&pieces(build_chunks), parts, part);
    // Probe rows are bucketed as 32-bit offsets into their piece (a piece holds
    // at most CPU_PIECE keys), not (row, key) pairs: 4 bytes a row instead of 16.
    // In a fresh process every scratch byte is a page fault first: on TPC-H SF10
    // (52M probe rows) the pairs cost ~600 MB of faults, ~0.15 s.
    let probe_pieces = pieces(probe_chunks);
    let Ok(probe_buckets): Result<Vec<Vec<Vec<u32>>>, Infallible> =
        crate::host::par_map(&probe_pieces, 1, |(_, keys)| {
            let mut b: Vec<Vec<u32>> = (0..parts).map(|_| Vec::with_capacity(keys.len() / parts * 2)).collect();
            for (j, &k) in keys.iter().enumerate() {
                b[part(k)].push(j as u32);
            }
            Ok(b)
        });
    let words: Vec<AtomicU32> = (0..probe_len.div_ceil(32)).map(|_| AtomicU32::new(0)).collect();
    let ids: Vec<usize> = (0..parts).collect();
    let Ok(_): Result<Vec<()>, Infallible> = crate::host::par_map(&ids, 1, |&p| {
        let n = build_buckets.iter().map(|b| b[p].len()).sum();
        let build = build_buckets.iter().flat_map(|b| b[p].iter().copied());
        let probe = probe_buckets
            .iter()
            .zip(&probe_pieces)
            .flat_map(|(b, (at, keys))| b[p].iter().map(move |&j| (at + j as usize, keys[j as usize])));
        select_serial(op, build, n, probe, |i| {
            words[i >> 5].fetch_or(1 << (i & 31), Ordering::Relaxed);
        });
        Ok(())
    });
    crate::host::drop_later((build_buckets, probe_buckets));
    words_to_bool(words.into_iter().map(AtomicU32::into_inner).collect(), probe_len)
}
