//! Host-side packing of keys in transit: frame-of-reference packing of u64
//! keys into 32-bit offsets per segment (decoded on the device by
//! `kernels/transfer.cu`), and the parallel gathers that fill pinned staging
//! from many Arrow slices.

// Frame-of-reference packing of u64 keys in transit (kernels/transfer.cu has the
// same constants): a fill of PACK_FILL keys in PACK_SEGS segments of PACK_SEG.
pub(super) const PACK_SEG: usize = 1 << 16;
pub(super) const PACK_SEGS: usize = 128;
pub(super) const PACK_FILL: usize = PACK_SEG * PACK_SEGS;
pub(super) const PACK_DESC: usize = 4096;

/// Reads several slices back to back, `n` elements at a time.
pub(super) struct Cursor<'a, T> {
    pub(super) chunks: &'a [&'a [T]],
    pub(super) ci: usize,
    pub(super) pos: usize,
}

impl<'a, T> Cursor<'a, T> {
    pub(super) fn new(chunks: &'a [&'a [T]]) -> Self {
        Self { chunks, ci: 0, pos: 0 }
    }

    /// The next `n` elements as pieces of the source slices (fewer at the end).
    pub(super) fn take(&mut self, n: usize) -> Vec<&'a [T]> {
        let mut pieces = Vec::new();
        let mut need = n;
        while need > 0 && self.ci < self.chunks.len() {
            let c = self.chunks[self.ci];
            let take = (c.len() - self.pos).min(need);
            if take > 0 {
                pieces.push(&c[self.pos..self.pos + take]);
            }
            self.pos += take;
            need -= take;
            if self.pos == c.len() {
                self.ci += 1;
                self.pos = 0;
            }
        }
        pieces
    }
}

/// Call `f` on the parts of the concatenation of `pieces` in [lo, hi).
pub(super) fn for_range<T>(pieces: &[&[T]], lo: usize, hi: usize, mut f: impl FnMut(&[T])) {
    let mut pos = 0;
    for p in pieces {
        let (p_lo, p_hi) = (pos, pos + p.len());
        pos = p_hi;
        let (a, b) = (p_lo.max(lo), p_hi.min(hi));
        if a < b {
            f(&p[a - p_lo..b - p_lo]);
        }
        if pos >= hi {
            break;
        }
    }
}

/// Frame-of-reference code one fill of `n` keys (at most `cap`) into a staging
/// buffer laid out for `cap` keys (layout in kernels/transfer.cu). Threads
/// take whole segments. A segment's base is its first key minus 2^31, so one
/// sweep can write every offset's low word and OR together the high words:
/// the segment is narrow iff that OR is zero (no compares, so it vectorises);
/// only wide segments are swept again for their high words.
/// Returns whether any segment needed high words.
pub(super) fn pack_fill(pieces: &[&[u64]], n: usize, buf: &mut [u8], cap: usize, threads: usize) -> bool {
    let segs = n.div_ceil(PACK_SEG);
    let (desc, rest) = buf.split_at_mut(PACK_DESC);
    let (low_bytes, high_bytes) = rest.split_at_mut(cap * 4);
    assert!(high_bytes.len() >= n * 4 && low_bytes.len() >= n * 4 && segs <= PACK_SEGS, "staging layout too small");
    // SAFETY: cuMemHostAlloc memory is page aligned and every region starts at a
    // multiple of 4 (desc at 0, low at 4096, high at 4096 + 4 cap) or 8 (bases);
    // u64/u32 have no invalid bit patterns; lengths were checked above.
    let (bases, flags, low, high) = unsafe {
        (
            std::slice::from_raw_parts_mut(desc.as_mut_ptr() as *mut u64, PACK_SEGS),
            std::slice::from_raw_parts_mut(desc.as_mut_ptr().add(PACK_SEGS * 8) as *mut u32, PACK_SEGS),
            std::slice::from_raw_parts_mut(low_bytes.as_mut_ptr() as *mut u32, n),
            std::slice::from_raw_parts_mut(high_bytes.as_mut_ptr() as *mut u32, n),
        )
    };
    struct Seg<'s> {
        at: usize,
        base: &'s mut u64,
        wide: &'s mut u32,
        low: &'s mut [u32],
        high: &'s mut [u32],
    }
    let mut work: Vec<Seg> = bases
        .iter_mut()
        .zip(flags.iter_mut())
        .zip(low.chunks_mut(PACK_SEG).zip(high.chunks_mut(PACK_SEG)))
        .take(segs)
        .enumerate()
        .map(|(i, ((base, wide), (low, high)))| Seg { at: i * PACK_SEG, base, wide, low, high })
        .collect();
    let pack = |segs: &mut [Seg]| -> bool {
        let mut any_wide = false;
        for s in segs {
            let len = s.low.len();
            let mut first = None;
            for_range(pieces, s.at, s.at + 1, |p| first = p.first().copied());
            let base = first.unwrap_or(0).wrapping_sub(1 << 31);
            let (mut at, mut over) = (0usize, 0u64);
            for_range(pieces, s.at, s.at + len, |p| {
                over |= pack_low(&mut s.low[at..at + p.len()], p, base);
                at += p.len();
            });
            let wide = over != 0;
            if wide {
                let mut at = 0;
                for_range(pieces, s.at, s.at + len, |p| {
                    s.high[at..at + p.len()]
                        .iter_mut()
                        .zip(p)
                        .for_each(|(o, &k)| *o = (k.wrapping_sub(base) >> 32) as u32);
                    at += p.len();
                });
            }
            *s.base = base;
            *s.wide = wide as u32;
            any_wide |= wide;
        }
        any_wide
    };
    // From four segments the pool's threads share the fill: a small device
    // budget streams fills of 327K keys (five segments), which one thread
    // packed in ~0.5 ms each, most of a 64 MiB budget's time over budget.
    if threads <= 1 || segs < crate::env::pack_min_segments() {
        return pack(&mut work);
    }
    // The pool's persistent threads: a fresh thread scope per fill cost ~0.5 ms.
    // Four parts per thread, claimed as threads come free: with one part each,
    // a fill waits for its slowest thread, and on a busy host one thread that
    // loses its core for a while (the reaper freeing the last query's inputs,
    // another tenant) stretches every fill.
    let per = work.len().div_ceil(threads * 4).max(1);
    let mut parts: Vec<&mut [Seg]> = work.chunks_mut(per).collect();
    let any_wide = std::sync::atomic::AtomicBool::new(false);
    crate::host::for_each_mut(&mut parts, &|_, segs| {
        if pack(segs) {
            any_wide.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    any_wide.into_inner()
}

/// Write the low words of `k - base` for every key of `src` into `dst` (same
/// length) and return the OR of their high words (zero: all offsets fit 32 bits).
/// On x86_64 the bulk goes through SSE2 non-temporal stores: the pinned staging
/// memory is only read again by the DMA engine, so filling cache lines for it
/// (a read-for-ownership per line) would cost a third of the memory traffic.
pub(super) fn pack_low(dst: &mut [u32], src: &[u64], base: u64) -> u64 {
    debug_assert_eq!(dst.len(), src.len());
    let n = dst.len().min(src.len());
    let mut over = 0u64;
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // Scalar head up to a 16-byte aligned destination.
        while i < n && (dst.as_ptr() as usize + i * 4) % 16 != 0 {
            let v = src[i].wrapping_sub(base);
            dst[i] = v as u32;
            over |= v >> 32;
            i += 1;
        }
        if i + 4 <= n {
            // SAFETY: SSE2 is part of the x86_64 baseline; every access is within
            // i + 4 <= n elements of both slices, and dst + i is 16-byte aligned
            // (checked above) as the streaming store requires; the sfence orders
            // the non-temporal stores before this thread's later (joined) writes.
            unsafe {
                let vb = _mm_set1_epi64x(base as i64);
                let mut vo = _mm_setzero_si128();
                while i + 4 <= n {
                    let a = _mm_sub_epi64(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i), vb);
                    let b = _mm_sub_epi64(_mm_loadu_si128(src.as_ptr().add(i + 2) as *const __m128i), vb);
                    vo = _mm_or_si128(vo, _mm_or_si128(_mm_srli_epi64(a, 32), _mm_srli_epi64(b, 32)));
                    // dwords 0 and 2 of a, then of b: the four low words in key order
                    let lo = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), 0b10_00_10_00));
                    _mm_stream_si128(dst.as_mut_ptr().add(i) as *mut __m128i, lo);
                    i += 4;
                }
                _mm_sfence();
                let mut lanes = [0u64; 2];
                _mm_storeu_si128(lanes.as_mut_ptr() as *mut __m128i, vo);
                over |= lanes[0] | lanes[1];
            }
        }
    }
    while i < n {
        let v = src[i].wrapping_sub(base);
        dst[i] = v as u32;
        over |= v >> 32;
        i += 1;
    }
    over
}

/// CPU twin of `decode_for` in kernels/transfer.cu: the keys of one packed fill.
#[cfg(test)]
pub(super) fn decode_fill_cpu(buf: &[u8], n: usize, cap: usize) -> Vec<u64> {
    let word = |off: usize| u32::from_le_bytes(buf[off..off + 4].try_into().unwrap()) as u64;
    (0..n)
        .map(|i| {
            let s = i / PACK_SEG;
            let base = u64::from_le_bytes(buf[s * 8..s * 8 + 8].try_into().unwrap());
            let wide = word(PACK_SEGS * 8 + s * 4) != 0;
            let mut v = word(PACK_DESC + i * 4);
            if wide {
                v |= word(PACK_DESC + cap * 4 + i * 4) << 32;
            }
            base.wrapping_add(v)
        })
        .collect()
}
