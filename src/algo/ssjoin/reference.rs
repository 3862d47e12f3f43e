//! References for tests and benchmarks: brute force and an exact counter.

use super::cpu::*;
use super::plan::*;
use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Nested-loop reference: every pair, full merge, the same predicate.
pub fn ssjoin_brute_force(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let mut out = Vec::new();
    for x in 0..r.len() {
        let ys = if self_join { 0..x } else { 0..s.len() };
        for y in ys {
            let o = overlap_at_least(r.set(x), s.set(y), 0).unwrap_or(0);
            if thr.passes(o, r.size(x), s.size(y)) {
                let (a, b) = (r.ids[x], s.ids[y]);
                out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
            }
        }
    }
    out
}

/// Exact reference without any filter: a full inverted index over `s` counts
/// every intersecting pair, then the predicate decides (thresholds > 0 need
/// overlap >= 1). Multithreaded; fast enough for tens of thousands of sets.
pub fn ssjoin_exact_counter(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let vocab = r.vocabulary().max(s.vocabulary()) as usize;
    let mut offsets = vec![0u32; vocab + 1];
    for &t in &s.tokens {
        offsets[t as usize + 1] += 1;
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut fill = offsets.clone();
    let mut lists = vec![0u32; s.tokens.len()];
    for p in 0..s.len() {
        for &t in s.set(p) {
            lists[fill[t as usize] as usize] = p as u32;
            fill[t as usize] += 1;
        }
    }
    let states = parallel_chunks(
        r.len(),
        default_threads(),
        32,
        || (vec![0u32; s.len()], Vec::<u32>::new(), Vec::<Pair>::new()),
        |start, end, (counts, touched, out)| {
            for x in start..end {
                for &t in r.set(x) {
                    let list = &lists[offsets[t as usize] as usize..offsets[t as usize + 1] as usize];
                    let end = if self_join { list.partition_point(|&y| (y as usize) < x) } else { list.len() };
                    for &y in &list[..end] {
                        if counts[y as usize] == 0 {
                            touched.push(y);
                        }
                        counts[y as usize] += 1;
                    }
                }
                for &y in touched.iter() {
                    let o = std::mem::take(&mut counts[y as usize]);
                    if thr.passes(o, r.size(x), s.size(y as usize)) {
                        let (a, b) = (r.ids[x], s.ids[y as usize]);
                        out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
                    }
                }
                touched.clear();
            }
        },
    );
    states.into_iter().flat_map(|(_, _, o)| o).collect()
}

/// UNIFORM / ZIPF collections (also timed by ssjoin's `plan_timing` test).
pub fn generate(n: usize, zipf: bool, seed: u64) -> RawSets {
    const UNIVERSE: usize = 100_000;
    let mut rng = StdRng::seed_from_u64(seed);
    let cdf: Vec<f64> = if zipf {
        (1..=UNIVERSE)
            .scan(0.0, |a, i| {
                *a += 1.0 / i as f64;
                Some(*a)
            })
            .collect()
    } else {
        Vec::new()
    };
    let total = cdf.last().copied().unwrap_or(1.0);
    let draw = |rng: &mut StdRng| -> u64 {
        if zipf {
            let u = rng.random::<f64>() * total;
            cdf.partition_point(|&c| c < u) as u64
        } else {
            rng.random_range(0..UNIVERSE as u64)
        }
    };
    let mut raw = RawSets::new();
    for i in 0..n {
        if i > 0 && rng.random_range(0..100) == 0 {
            let src = rng.random_range(0..i);
            let mut s: Vec<u64> = raw.set(src).to_vec();
            for x in s.iter_mut() {
                if rng.random_range(0..10) == 0 {
                    *x = draw(&mut rng);
                }
            }
            raw.push(s);
        } else {
            let k = rng.random_range(10..=50);
            let s: Vec<u64> = (0..k).map(|_| draw(&mut rng)).collect();
            raw.push(s);
        }
    }
    raw
}
