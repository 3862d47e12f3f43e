//! Tests of both backends against the references.

use super::cpu::*;
use super::gpu::*;
use super::plan::*;
use super::reference::*;
use super::*;
use crate::algo::ssjoin_prep::preprocess;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Uniform elements in [0, universe), sizes in [0, max_size].
pub(crate) fn uniform(n: usize, universe: u64, max_size: usize, seed: u64) -> RawSets {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut r = RawSets::new();
    for _ in 0..n {
        let k = rng.random_range(0..=max_size);
        r.push((0..k).map(|_| rng.random_range(0..universe)).collect::<Vec<_>>());
    }
    r
}

/// Zipf-skewed elements (exponent ~1) via inverse CDF on a harmonic table.
pub(crate) fn zipf(n: usize, universe: usize, max_size: usize, seed: u64) -> RawSets {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cdf = Vec::with_capacity(universe);
    let mut acc = 0.0;
    for i in 1..=universe {
        acc += 1.0 / i as f64;
        cdf.push(acc);
    }
    let mut r = RawSets::new();
    for _ in 0..n {
        let k = rng.random_range(0..=max_size);
        r.push(
            (0..k)
                .map(|_| {
                    let u = rng.random::<f64>() * acc;
                    cdf.partition_point(|&c| c < u) as u64 * 7919 + 3
                })
                .collect::<Vec<_>>(),
        );
    }
    r
}

fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
    v.sort_unstable();
    v
}

fn thresholds() -> Vec<Threshold> {
    let mut v = Vec::new();
    for m in [Metric::Jaccard, Metric::Dice, Metric::Cosine] {
        for t in [0.1, 0.3, 0.5, 0.6, 0.75, 0.9, 1.0] {
            v.push(Threshold::new(m, t));
        }
        v.push(Threshold::strict(m, 0.5));
        v.push(Threshold::strict(m, 1.0));
        // Sharing an element; none passes above 1 or a NaN.
        v.push(Threshold::strict(m, 0.0));
        v.push(Threshold::strict(m, -0.0));
        v.push(Threshold::new(m, 1.5));
        v.push(Threshold::new(m, f64::NAN));
    }
    for k in [1.0, 2.0, 3.0, 2.5, 0.5, 1e12] {
        v.push(Threshold::new(Metric::Overlap, k));
    }
    v.push(Threshold::strict(Metric::Overlap, 2.0));
    v.push(Threshold::strict(Metric::Overlap, 0.0));
    assert!(v.iter().all(|t| t.check().is_ok()), "{v:?}");
    v
}

/// The thresholds every pair passes (the metric's 0 passes, compared as
/// DataFusion compares floats, -0.0 as 0.0) are the join's to refuse; all
/// others are its.
#[test]
fn every_pair_passes_where_zero_passes() {
    let neg_nan = f64::from_bits(f64::NAN.to_bits() | 1 << 63);
    for m in [Metric::Jaccard, Metric::Dice, Metric::Cosine, Metric::Overlap] {
        for (t, strict) in [(0.0, false), (-0.0, false), (-1.0, true), (-1.0, false), (neg_nan, true)] {
            let thr = Threshold { metric: m, value: t, strict };
            assert!(thr.every_pair_passes() && thr.check().is_err(), "{thr:?}");
            assert!(thr.passes(0, 3, 4) && thr.passes(0, 0, 0), "{thr:?}");
        }
        // -0.0 is 0.0 to DataFusion: `> -0.0` is sharing an element.
        for (t, strict) in
            [(0.0, true), (-0.0, true), (1e-300, false), (2.0, false), (f64::NAN, false), (f64::INFINITY, true)]
        {
            let thr = Threshold { metric: m, value: t, strict };
            assert!(!thr.every_pair_passes() && thr.check().is_ok(), "{thr:?}");
            assert!(!thr.passes(0, 3, 4), "{thr:?}");
        }
    }
}

fn collections() -> Vec<(&'static str, RawSets, RawSets)> {
    vec![
        ("uniform", uniform(300, 40, 12, 1), uniform(250, 40, 12, 2)),
        ("zipf", zipf(300, 200, 20, 3), zipf(200, 200, 20, 4)),
        ("dups", uniform(200, 8, 10, 5), uniform(100, 8, 6, 6)),
    ]
}

#[test]
fn min_overlap_and_size_range_agree_with_predicate() {
    for thr in thresholds() {
        for a in 0..40u32 {
            for b in 0..40u32 {
                let expect = (1..=a.min(b)).find(|&o| thr.passes(o, a, b));
                assert_eq!(thr.min_overlap(a, b), expect, "{thr:?} a={a} b={b}");
            }
            let feasible: Vec<u32> = (1..=60).filter(|&b| a > 0 && thr.passes(a.min(b), a, b)).collect();
            let range = thr.size_range(a, 60);
            match range {
                None => assert!(feasible.is_empty(), "{thr:?} a={a}"),
                Some((lo, hi)) => assert_eq!(feasible, (lo..=hi).collect::<Vec<_>>(), "{thr:?} a={a}"),
            }
        }
    }
}

#[test]
fn preprocess_orders_tokens_and_sets() {
    let raw = RawSets::from_vecs(&[vec![5, 5, 1, 9], vec![], vec![1], vec![1, 9, 2]]);
    let (c, _) = preprocess(&raw, None);
    // 1 appears in 3 sets, 9 in 2, 5 and 2 in one: 2 and 5 get the smallest ids.
    assert_eq!(c.ids, vec![1, 2, 0, 3]);
    assert_eq!(c.size(0), 0);
    for p in 0..c.len() {
        assert!(c.set(p).windows(2).all(|w| w[0] < w[1]));
    }
    let id_of_1 = c.set(1)[0];
    assert_eq!(id_of_1, 3, "most frequent token gets the largest id");
    // The recorded vocabulary (the plan's offsets length) is one past
    // the largest token, of both sides for a pair.
    assert_eq!(c.vocab, c.vocabulary());
    for (_, a, b) in collections() {
        let (r, s) = preprocess(&a, Some(&b));
        let s = s.unwrap();
        assert_eq!((r.vocab, s.vocab), (r.vocabulary().max(s.vocabulary()), r.vocab));
        let (r, _) = preprocess(&a, None);
        assert_eq!(r.vocab, r.vocabulary());
    }
}

#[test]
fn cpu_matches_brute_force() {
    for (name, a, b) in collections() {
        let (r, s) = preprocess(&a, Some(&b));
        let s = s.unwrap();
        let (rs, _) = preprocess(&a, None);
        for thr in thresholds() {
            let want = sorted(ssjoin_brute_force(&rs, None, thr));
            assert_eq!(sorted(ssjoin_cpu(&rs, None, thr)), want, "{name} self {thr:?}");
            assert_eq!(sorted(ssjoin_exact_counter(&rs, None, thr)), want, "{name} self counter {thr:?}");
            let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
            assert_eq!(sorted(ssjoin_cpu(&r, Some(&s), thr)), want, "{name} r-s {thr:?}");
            assert_eq!(sorted(ssjoin_cpu_with(&r, Some(&s), thr, 3, &mut JoinStats::default())), want);
        }
    }
}

/// Reference prefix index: one list per token, sets appended in order.
fn naive_index(c: &SetCollection, prefix: &[u32], vocab: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut lists = vec![Vec::new(); vocab];
    for p in 0..c.len() {
        let set = c.set(p);
        for (j, &t) in set[..prefix[set.len()] as usize].iter().enumerate() {
            lists[t as usize].push((p as u32, j as u32));
        }
    }
    let mut offsets = vec![0u32];
    for l in &lists {
        offsets.push(offsets.last().unwrap() + l.len() as u32);
    }
    let flat = lists.iter().flatten();
    (offsets, flat.clone().map(|e| e.0).collect(), flat.map(|e| e.1).collect())
}

/// The index build equals a naive one (same lists, same order) for any
/// thread count including more threads than sets, with one token per
/// bucket (small vocabulary) or several, a vocabulary past the largest
/// token, and both first-pass entry widths.
#[test]
fn parallel_prefix_index_matches_serial() {
    let (small, _) = preprocess(&zipf(3000, 500, 30, 21), None);
    let (large, _) = preprocess(&zipf(3000, 20_000, 40, 22), None);
    assert_eq!(IndexShape::new(small.len(), small.vocabulary() as usize, 0, false).shift, 0);
    assert!(IndexShape::new(large.len(), large.vocabulary() as usize, 0, false).shift >= 3);
    for c in [&small, &large] {
        for slack in [0, 37] {
            let vocab = c.vocabulary() as usize + slack;
            for cut in [0u32, 1, 3] {
                // prefix[b]: all but `cut` tokens of a set of size b.
                let prefix: Vec<u32> = (0..=c.max_size()).map(|b| b.saturating_sub(cut)).collect();
                let (offsets, sets, positions) = naive_index(c, &prefix, vocab);
                let what = format!("vocab {vocab} cut {cut}");
                for threads in [1, 2, 3, 7, 16, 64] {
                    for pos in [true, false] {
                        let idx = PrefixIndex::build(c, &prefix, vocab, pos, threads, 1);
                        assert_eq!(idx.offsets, offsets, "{what} threads {threads}");
                        assert_eq!(idx.sets, sets, "{what} threads {threads}");
                        if pos {
                            assert_eq!(idx.positions, positions, "{what} threads {threads}");
                        } else {
                            assert!(idx.positions.is_empty());
                        }
                    }
                }
                // u64 entries (taken when a bucket offset and a set
                // position do not fit 32 bits together).
                let (bounds, total) = PrefixIndex::set_ranges(c, &prefix, 3, 1);
                let shape = IndexShape::new(c.len(), vocab, total, true);
                assert!(shape.packs_u32());
                let wide = PrefixIndex::build_with::<u64>(c, &prefix, &bounds, shape);
                assert_eq!((&wide.offsets, &wide.sets, &wide.positions), (&offsets, &sets, &positions), "{what} u64");
            }
        }
    }
    // More threads than sets.
    let (few, _) = preprocess(&uniform(5, 30, 12, 8), None);
    let prefix: Vec<u32> = (0..=few.max_size()).collect();
    let v = few.vocabulary() as usize;
    let many = PrefixIndex::build(&few, &prefix, v, true, 16, 1);
    assert_eq!((many.offsets, many.sets, many.positions), naive_index(&few, &prefix, v));
    let (e, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
    let idx = PrefixIndex::build(&e, &[0], 0, true, 4, 1);
    assert_eq!((idx.offsets, idx.sets.len()), (vec![0], 0));
}

/// Host plan time on bench-like 100k collections, by phase: UNIFORM-like
/// (sizes 10..=50, universe 100k) and the bench's own ZIPF-100k, whose
/// GPU run at Jaccard 0.6 waited on the plan (the collection upload on a
/// second thread takes about 2 ms there).
/// `cargo test --release --lib plan_timing -- --ignored --nocapture`;
/// SSJOIN_PLAN_THREADS=1,2,16 sets the thread counts (default: 1 and all).
/// Phases, each on this thread: layout (length tables), ranges (entry
/// count, set ranges), partition and gather (the index build's passes).
#[test]
#[ignore]
fn plan_timing() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut raw = RawSets::new();
    for _ in 0..100_000 {
        let k = rng.random_range(10..=50);
        raw.push((0..k).map(|_| rng.random_range(0..100_000u64)).collect::<Vec<_>>());
    }
    let (uniform_c, _) = preprocess(&raw, None);
    let (zipf_c, _) = preprocess(&crate::algo::ssjoin::reference::generate(100_000, true, 13 + 100_000), None);
    let threads: Vec<usize> = crate::env::ssjoin_plan_threads().unwrap_or_else(|| vec![1, default_threads()]);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    for (name, c) in [("uniform", &uniform_c), ("zipf", &zipf_c)] {
        eprintln!("{name}: {} sets, {} tokens, vocabulary {}", c.len(), c.tokens.len(), c.vocabulary());
        for t in [0.5, 0.6, 0.9] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let mut runs = vec![(1, true)];
            runs.extend(threads.iter().map(|&n| (n, false)));
            for (threads, pos) in runs {
                let mut best = std::time::Duration::MAX;
                let mut phases = [std::time::Duration::MAX; 4];
                let mut workers = 0;
                for _ in 0..9 {
                    let t0 = Instant::now();
                    let plan = Plan::new(c, None, thr, pos, threads);
                    best = best.min(t0.elapsed());
                    std::hint::black_box(&plan.index.sets);
                    drop(plan);
                    // The same steps one by one.
                    let t0 = Instant::now();
                    let l = Plan::layout(c, None, thr);
                    let t1 = Instant::now();
                    let (bounds, total) = PrefixIndex::set_ranges(c, &l.index_prefix, threads, INDEX_WORK_PER_THREAD);
                    let t2 = Instant::now();
                    // The two passes on this thread (u32 entries here).
                    let shape = IndexShape::new(c.len(), l.vocab, total, pos);
                    assert!(shape.packs_u32());
                    let parts: Vec<IndexPart<u32>> = bounds
                        .windows(2)
                        .map(|w| PrefixIndex::partition(c, &l.index_prefix, &shape, w[0]..w[1]))
                        .collect();
                    let t3 = Instant::now();
                    let (mut offsets, mut sets, mut positions) =
                        (vec![0u32; l.vocab + 1], vec![0u32; total], vec![0u32; if pos { total } else { 0 }]);
                    let off = &mut offsets[..l.vocab];
                    for job in PrefixIndex::jobs(&parts, &shape, parts.len(), off, &mut sets, &mut positions) {
                        PrefixIndex::gather(&parts, &shape, job);
                    }
                    let t4 = Instant::now();
                    std::hint::black_box(&sets);
                    workers = bounds.len() - 1;
                    for (p, d) in phases.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
                        *p = (*p).min(d);
                    }
                }
                let entries = Plan::new(c, None, thr, pos, threads).index.sets.len();
                eprintln!(
                    "{name} t={t} threads={threads} ({workers} used) positions={pos}: plan {:.3} ms ({entries} entries); \
                     layout {:.3} ranges {:.3} partition {:.3} gather {:.3}",
                    ms(best),
                    ms(phases[0]),
                    ms(phases[1]),
                    ms(phases[2]),
                    ms(phases[3])
                );
            }
        }
    }
}

#[test]
fn empty_inputs() {
    let empty = RawSets::new();
    let some = RawSets::from_vecs(&[vec![1, 2], vec![], vec![2, 1, 1]]);
    let thr = Threshold::new(Metric::Jaccard, 0.5);
    let (e, _) = preprocess(&empty, None);
    assert!(ssjoin_cpu(&e, None, thr).is_empty());
    let (r, s) = preprocess(&empty, Some(&some));
    assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
    let (r, s) = preprocess(&some, Some(&empty));
    assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
    let (r, _) = preprocess(&some, None);
    assert_eq!(ssjoin_cpu(&r, None, thr), vec![(0, 2, 2)]);
    // Only empty sets: nothing joins (empty/empty similarity is 0).
    let (r, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
    assert!(ssjoin_cpu(&r, None, Threshold::new(Metric::Jaccard, 0.01)).is_empty());
}

/// GPU vs brute force; skips without a device unless SETFUSION_REQUIRE_GPU=1.
#[test]
fn gpu_matches_brute_force() {
    let g = match crate::gpu::gpu(0) {
        Ok(g) => g,
        Err(e) => {
            if crate::env::require_gpu() {
                panic!("SETFUSION_REQUIRE_GPU=1 but no GPU: {e}");
            }
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping gpu_matches_brute_force: {e}");
            return;
        }
    };
    let g = g.lease(0);
    for limit in [0usize, 1 << 20] {
        g.budget().set_limit(limit);
        for (name, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let s = s.unwrap();
            let (rs, _) = preprocess(&a, None);
            for thr in thresholds() {
                let want = sorted(ssjoin_brute_force(&rs, None, thr));
                let got = ssjoin_gpu(&g, &rs, None, thr, &mut JoinStats::default()).unwrap();
                assert_eq!(sorted(got), want, "{name} self {thr:?} limit {limit}");
                let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
                let got = ssjoin_gpu(&g, &r, Some(&s), thr, &mut JoinStats::default()).unwrap();
                assert_eq!(sorted(got), want, "{name} r-s {thr:?} limit {limit}");
            }
        }
    }
    // Tiny shared tables (nearly every probe deferred to global tables, in
    // many groups) and a one-triple output buffer (overflow: grow, drain).
    g.budget().set_limit(1 << 20);
    for (name, a, b) in collections() {
        let (r, s) = preprocess(&a, Some(&b));
        let (rs, _) = preprocess(&a, None);
        for shared_slots in [32, 64] {
            let tuning = GpuTuning { shared_slots, out_start: Some(1) };
            for thr in thresholds() {
                let want = sorted(ssjoin_brute_force(&rs, None, thr));
                let got = ssjoin_gpu_tuned(&g, &rs, None, thr, &mut JoinStats::default(), tuning).unwrap();
                assert_eq!(sorted(got), want, "{name} self {thr:?} tuned {tuning:?}");
                let want = sorted(ssjoin_brute_force(&r, s.as_ref(), thr));
                let got = ssjoin_gpu_tuned(&g, &r, s.as_ref(), thr, &mut JoinStats::default(), tuning).unwrap();
                assert_eq!(sorted(got), want, "{name} r-s {thr:?} tuned {tuning:?}");
            }
        }
    }
    // Sets longer than one segment chunk (128 prefix tokens), few of them.
    let long = uniform(60, 400, 390, 12);
    let (lr, _) = preprocess(&long, None);
    for t in [0.05, 0.2, 0.5] {
        let thr = Threshold::new(Metric::Jaccard, t);
        let want = sorted(ssjoin_brute_force(&lr, None, thr));
        assert_eq!(sorted(ssjoin_gpu(&g, &lr, None, thr, &mut JoinStats::default()).unwrap()), want, "long t={t}");
        let tuning = GpuTuning { shared_slots: 32, out_start: Some(1) };
        let got = ssjoin_gpu_tuned(&g, &lr, None, thr, &mut JoinStats::default(), tuning).unwrap();
        assert_eq!(sorted(got), want, "long tuned t={t}");
    }
    // A larger skewed self join streamed through many small blocks.
    g.budget().set_limit(4 << 20);
    let (r, _) = preprocess(&zipf(5000, 2000, 40, 9), None);
    for t in [0.3, 0.6, 0.9] {
        let thr = Threshold::new(Metric::Jaccard, t);
        let mut st = JoinStats::default();
        let got = sorted(ssjoin_gpu(&g, &r, None, thr, &mut st).unwrap());
        assert_eq!(got, sorted(ssjoin_exact_counter(&r, None, thr)), "zipf 5000 t={t}");
        assert!(st.blocks >= 1);
    }
    g.budget().set_limit(0);
}

#[test]
fn scattered_chunks_visit_each_chunk_once() {
    for n in [1, 2, 3, 4, 10, 64, 97, 100, 1563, 4096] {
        let stride = super::cpu::scatter_stride(n);
        let mut seen: Vec<usize> = (0..n).map(|k| k * stride % n).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}, stride {stride}");
    }
}
