//! Several devices (`setfusion.devices`): the selection split so that every
//! device moves and probes a share of the keys, with no host pass over the
//! keys beyond the packing every upload does anyway.
//!
//! - Dense domains (the bitmap tables): each device uploads a share of the
//!   build rows and builds presence bits over the common domain; the bits
//!   (one per domain value: 50 MB for 400M values) are OR-ed on the host and
//!   loaded into every device, so each holds the whole build side. The probe
//!   side is split by row ranges: each device selects its range and writes
//!   its words of the selection. The multiset rules rank equal probe rows: a
//!   row's rank counts the copies in earlier ranges too, so a device after the
//!   first probes again with the bits that earlier ranges left unclaimed (each
//!   range's claims come from a first probe that runs while the uploads go
//!   on; [`BitmapTable::load_words`]).
//! - Semi / anti joins on sparse keys (the hash table): the build keys go to
//!   every device, the probe side splits by row ranges (no rank to carry).
//! - The rest (EXCEPT DISTINCT, the sort strategy, the multiset rules on
//!   sparse keys or with a repeated build key): the keys split by hash on the
//!   host ([`select_gpus_by_key`]).
//!
//! Every way gives the same answer as one device and as the CPU twin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::error::{DataFusionError, Result};

use super::auto::{choose_table, combine_words, select_gpus_by_key, select_streamed};
use super::bitmap::{BitmapTable, BITMAP_MAX_RANGE};
use super::{key_range_chunks, merge_ranges, words_to_bool, GpuStrategy, SetOp};
use crate::gpu::{DeviceBuffer, Gpu, TransferStats};
use crate::util::trace;

/// The selection over several devices (see the module notes); `gpus` may
/// name one device more than once (its shares then run one after the other).
/// The caller holds every device. Returns the selection and what ran.
pub fn select_gpus(
    gpus: &[&Gpu],
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<(BooleanBuffer, String)> {
    let (nb, np) = (total(build), total(probe));
    let mut why = String::new();
    let rows = !crate::env::devices_key_split();
    if rows && gpus.len() > 1 && nb > 0 && np > 0 && op != SetOp::ExceptDistinct && forced != Some(GpuStrategy::Sort) {
        match select_by_rows(gpus, forced, op, build, probe, stats) {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(reason)) => why = reason,
            // Over a device's budget: the key split partitions within it.
            Err(e) if crate::gpu::is_out_of_memory(&e) => {
                why = format!("row ranges over the device budget: {}", crate::util::one_line(&e))
            }
            Err(e) => return Err(e),
        }
        trace(&format!("gpus: {why}; keys split by hash"));
    }
    let (sel, ran) = select_gpus_by_key(gpus, forced, op, build, probe, stats)?;
    Ok((sel, if why.is_empty() { ran } else { format!("{ran} ({why})") }))
}

fn total(chunks: &[&[u64]]) -> usize {
    chunks.iter().map(|c| c.len()).sum()
}

/// The rows [lo, hi) of the concatenation of `chunks`, as pieces of them.
fn rows_of<'a>(chunks: &[&'a [u64]], lo: usize, hi: usize) -> Vec<&'a [u64]> {
    let (mut out, mut at) = (Vec::new(), 0usize);
    for c in chunks {
        let (a, b) = (lo.max(at), hi.min(at + c.len()));
        if a < b {
            out.push(&c[a - at..b - at]);
        }
        at += c.len();
        if at >= hi {
            break;
        }
    }
    out
}

/// The domain of a sample of the keys (64 runs of 1,024, spread evenly): a
/// lower bound on the whole domain, enough to see that keys are sparse
/// before any upload.
fn sample_range(chunks: &[&[u64]]) -> Option<(u64, u64)> {
    let n = total(chunks);
    let step = (n / 64).max(1);
    (0..n)
        .step_by(step)
        .fold(None, |acc, at| merge_ranges(acc, key_range_chunks(&rows_of(chunks, at, (at + 1024).min(n)))))
}

/// One device's share: build rows to load, probe rows to select, and its
/// words of the selection.
struct Part<'a> {
    gpu: &'a Gpu,
    build: Vec<&'a [u64]>,
    probe: Vec<&'a [u64]>,
    np: usize,
    /// The selection's words of this share's probe rows (its rows start at a multiple of 32).
    dst: &'a mut [u32],
    d_build: Option<DeviceBuffer<u64>>,
    range: Option<(u64, u64)>,
    table: Option<BitmapTable>,
    /// A build key occurred twice within the share.
    repeated: bool,
    presence: Vec<u32>,
    /// The merged presence bits that the share's first probe left unclaimed.
    unclaimed: Vec<u32>,
    keys: Option<DeviceBuffer<u64>>,
    out: Option<DeviceBuffer<u32>>,
    ran: &'static str,
    stats: TransferStats,
}

/// Run `f(p, part)` for every share, one thread per distinct device, each
/// device's shares in ascending order; the first error is returned.
fn on_devices<'a>(
    parts: &[Mutex<Part<'a>>],
    ordinals: &[usize],
    f: &(dyn Fn(usize, &mut Part<'a>) -> Result<()> + Sync),
) -> Result<()> {
    let mut devices = ordinals.to_vec();
    devices.sort_unstable();
    devices.dedup();
    let run = |d: usize| -> Result<()> {
        for (p, part) in parts.iter().enumerate().filter(|(p, _)| ordinals[*p] == d) {
            f(p, &mut *part.lock().unwrap_or_else(|e| e.into_inner()))?;
        }
        Ok(())
    };
    if devices.len() == 1 {
        return run(devices[0]);
    }
    let run = &run;
    let results: Vec<Result<()>> = crate::host::scope(|s| {
        let handles: Vec<_> = devices.iter().map(|&d| s.spawn(&format!("device-{d}"), move || run(d))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    results.into_iter().collect()
}

/// OR of several shares' bitmaps, on the copy threads; and whether two shares
/// set the same bit (a build key in both).
fn merge_words(all: &[&[u32]]) -> (Vec<u32>, bool) {
    let words = all.iter().map(|w| w.len()).max().unwrap_or(0);
    let mut merged = vec![0u32; words];
    let clash = AtomicBool::new(false);
    let per = words.div_ceil(crate::host::copy_threads() * 4).max(1 << 16);
    let mut pieces: Vec<&mut [u32]> = merged.chunks_mut(per).collect();
    crate::host::for_each_mut(&mut pieces, &|i, piece| {
        let base = i * per;
        let mut both = 0u32;
        for (j, w) in piece.iter_mut().enumerate() {
            let mut acc = 0u32;
            for a in all.iter().filter(|a| a.len() == words) {
                let x = a[base + j];
                both |= acc & x;
                acc |= x;
            }
            *w = acc;
        }
        if both != 0 {
            clash.store(true, Ordering::Relaxed);
        }
    });
    (merged, clash.into_inner())
}

/// Probe rows split by ranges across `gpus` (the module notes). `Ok(Err(why))`
/// when this split cannot serve these keys (the caller splits by hash).
fn select_by_rows(
    gpus: &[&Gpu],
    forced: Option<GpuStrategy>,
    op: SetOp,
    build: &[&[u64]],
    probe: &[&[u64]],
    stats: &mut TransferStats,
) -> Result<std::result::Result<(BooleanBuffer, String), String>> {
    let (nb, np, k) = (total(build), total(probe), gpus.len());
    let ordinals: Vec<usize> = gpus.iter().map(|g| g.info().ordinal).collect();
    let devices = {
        let mut d = ordinals.clone();
        d.sort_unstable();
        d.dedup();
        d.len()
    };
    // Probe rows in ranges starting at multiples of 32 (whole selection words);
    // build rows in even shares.
    let per_p = np.div_ceil(k).next_multiple_of(32);
    let per_b = nb.div_ceil(k);
    let mut words = vec![0u32; np.div_ceil(32)];
    let parts: Vec<Mutex<Part>> = {
        let mut rest: &mut [u32] = &mut words;
        (0..k)
            .map(|p| {
                let (lo, hi) = ((p * per_p).min(np), ((p + 1) * per_p).min(np));
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut((hi - lo).div_ceil(32));
                rest = tail;
                Mutex::new(Part {
                    gpu: gpus[p],
                    build: rows_of(build, (p * per_b).min(nb), ((p + 1) * per_b).min(nb)),
                    probe: rows_of(probe, lo, hi),
                    np: hi - lo,
                    dst: mine,
                    d_build: None,
                    range: None,
                    table: None,
                    repeated: false,
                    presence: Vec::new(),
                    unclaimed: Vec::new(),
                    keys: None,
                    out: None,
                    ran: "",
                    stats: TransferStats::default(),
                })
            })
            .collect()
    };
    let bitmap_ok = matches!(forced, None | Some(GpuStrategy::Bitmap));
    let sparse = sample_range(build).is_some_and(|(lo, hi)| hi - lo >= BITMAP_MAX_RANGE);
    if bitmap_ok && !sparse {
        // 1. Each build share: resident, with its domain from the device, when it
        // fits with room to spare; else its domain from the host (streamed in 2).
        on_devices(&parts, &ordinals, &|p, part| {
            let n = total(&part.build);
            if n > 0 && n * 16 <= part.gpu.budget().available() {
                let (d, r) = part.gpu.upload_keys(&part.build, &mut part.stats)?;
                (part.d_build, part.range) = (Some(d), r);
            } else if n > 0 {
                part.range = key_range_chunks(&part.build);
            }
            trace(&format!("gpu {}: build share {p} uploaded ({n} keys)", part.gpu.info().ordinal));
            Ok(())
        })?;
        trace("gpus: build shares uploaded");
        let range =
            parts.iter().fold(None, |acc, p| merge_ranges(acc, p.lock().unwrap_or_else(|e| e.into_inner()).range));
        let (lo, hi) =
            range.ok_or_else(|| DataFusionError::Internal("setfusion: build keys without a domain".into()))?;
        let np_max = per_p.min(np);
        let bitmap = hi - lo < BITMAP_MAX_RANGE
            && (forced == Some(GpuStrategy::Bitmap)
                || choose_table(gpus[0], op, nb, np_max, Some((lo, hi))) == GpuStrategy::Bitmap);
        if bitmap {
            let done = select_bitmap_rows(parts, &ordinals, op, (lo, hi - lo + 1), stats)?;
            let how = if op.needs_counts() { ", ranks carried across ranges" } else { "" };
            return Ok(done.map(|()| {
                (words_to_bool(words, np), format!("gpu/bitmap on {devices} device(s), build bits merged on the host, probe rows in {k} ranges{how}"))
            }));
        }
        for p in &parts {
            p.lock().unwrap_or_else(|e| e.into_inner()).d_build = None;
        }
    }
    if !matches!(op, SetOp::Semi | SetOp::Anti) {
        return Ok(Err("no dense domain: the multiset rules need equal keys on one device".into()));
    }
    // Semi / anti joins: the whole build side on every device, probe rows by ranges.
    on_devices(&parts, &ordinals, &|p, part| {
        if part.np == 0 {
            return Ok(());
        }
        let (keys, out, strategy) = select_streamed(part.gpu, forced, op, build, &part.probe, &mut part.stats)?;
        drop(keys);
        part.gpu.download_into(&out, part.dst, &mut part.stats)?;
        part.ran = strategy.name();
        trace(&format!("gpu {}: probe range {p} selected against the whole build side", part.gpu.info().ordinal));
        Ok(())
    })?;
    let mut ran = finish(parts, stats);
    ran.sort_unstable();
    ran.dedup();
    Ok(Ok((
        words_to_bool(words, np),
        format!("gpu/{} on {devices} device(s), build keys on each, probe rows in {k} ranges", ran.join("+")),
    )))
}

/// The shares' transfer statistics into `stats`; what each ran.
fn finish(parts: Vec<Mutex<Part<'_>>>, stats: &mut TransferStats) -> Vec<&'static str> {
    parts
        .into_iter()
        .map(|p| {
            let p = p.into_inner().unwrap_or_else(|e| e.into_inner());
            stats.add(&p.stats);
            p.ran
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// Steps 2 to 4 of the dense split: bitmaps of the build shares merged on the
/// host and loaded on every device; probe ranges selected, ranks carried from
/// range to range for the multiset rules.
fn select_bitmap_rows(
    parts: Vec<Mutex<Part<'_>>>,
    ordinals: &[usize],
    op: SetOp,
    (lo, width): (u64, u64),
    stats: &mut TransferStats,
) -> Result<std::result::Result<(), String>> {
    let k = parts.len();
    let all_rule = matches!(op, SetOp::IntersectAll | SetOp::ExceptAll);
    // 2. Each share's presence bits (and whether a build key repeats in it).
    // Not sealed: EXCEPT DISTINCT, whose bits are inverted, splits by key.
    on_devices(&parts, ordinals, &|p, part| {
        let g = part.gpu;
        let table = BitmapTable::empty(g, op, lo, width)?;
        let dup = g.alloc_zeros::<u32>(1)?;
        let t = Instant::now();
        if let Some(d) = part.d_build.take() {
            table.add_build(g, &d.slice.slice(..), &dup)?;
        } else if !part.build.is_empty() {
            g.stream_keys(&part.build, width <= 1 << 31, &mut part.stats, &mut |keys, _| {
                table.add_build(g, keys, &dup)
            })?;
        }
        g.synchronize()?;
        part.stats.kernel += t.elapsed();
        part.repeated = all_rule && g.read_one(&dup, 0, &mut part.stats)? != 0;
        let bits =
            table.words().ok_or_else(|| DataFusionError::Internal("setfusion: bitmap table without words".into()))?;
        part.presence = g.download(bits, bits.len(), &mut part.stats)?;
        part.table = Some(table);
        trace(&format!("gpu {}: share {p} bits built and downloaded", g.info().ordinal));
        Ok(())
    })?;
    trace("gpus: build bits downloaded");
    let shares: Vec<Vec<u32>> =
        parts.iter().map(|p| std::mem::take(&mut p.lock().unwrap_or_else(|e| e.into_inner()).presence)).collect();
    let repeated = parts.iter().any(|p| p.lock().unwrap_or_else(|e| e.into_inner()).repeated);
    let (presence, clash) = merge_words(&shares.iter().map(Vec::as_slice).collect::<Vec<_>>());
    crate::host::drop_later(shares);
    if all_rule && (repeated || clash) {
        finish(parts, stats);
        return Ok(Err("a repeated build key: the ALL rules need counts".into()));
    }
    trace("gpus: build bits merged");
    // 3. Every device loads the merged bits and selects its range; the multiset
    // rules' later ranges keep their keys (they probe again in 4) and, but
    // for the last, first probe to learn which present keys they hold.
    let ranked = op.needs_counts();
    on_devices(&parts, ordinals, &|p, part| {
        let g = part.gpu;
        let mut table =
            part.table.take().ok_or_else(|| DataFusionError::Internal("setfusion: bitmap table missing".into()))?;
        table.load_words(g, &presence, &mut part.stats)?;
        let out = g.alloc_zeros::<u32>(part.np.div_ceil(32))?;
        let probe_now = !ranked || p == 0 || p + 1 < k;
        let keep_keys = ranked && p > 0 && part.np * 8 + (64 << 20) <= g.budget().available();
        let on_fill: &mut dyn FnMut(&cudarc::driver::CudaView<'_, u64>, usize) -> Result<()> = &mut |keys, first| {
            if probe_now {
                table.probe(g, op, keys, &out.slice.slice(first / 32..))?;
            }
            Ok(())
        };
        if part.np > 0 && keep_keys {
            part.keys = Some(g.upload_keys_each(&part.probe, &mut part.stats, false, on_fill)?.0);
        } else if part.np > 0 && probe_now {
            g.stream_keys(&part.probe, false, &mut part.stats, on_fill)?;
        }
        let t = Instant::now();
        g.synchronize()?;
        part.stats.kernel += t.elapsed();
        if ranked && p + 1 < k {
            let bits = table
                .words()
                .ok_or_else(|| DataFusionError::Internal("setfusion: bitmap table without words".into()))?;
            part.unclaimed = g.download(bits, bits.len(), &mut part.stats)?;
        }
        if !ranked || p == 0 {
            g.download_into(&out, part.dst, &mut part.stats)?;
            part.ran = "bitmap";
        }
        part.table = Some(table);
        part.out = Some(out);
        trace(&format!("gpu {}: probe range {p} selected ({} rows)", g.info().ordinal, part.np));
        Ok(())
    })?;
    trace("gpus: probe ranges selected");
    if ranked && k > 1 {
        // 4. Range p probes again with the bits that ranges 0..p left
        // unclaimed (each range's first probe started from the whole presence
        // bits, so those are the AND of their unclaimed bits): a row's rank
        // counts the copies before it in earlier ranges.
        let mut unclaimed: Vec<Vec<u32>> =
            parts.iter().map(|p| std::mem::take(&mut p.lock().unwrap_or_else(|e| e.into_inner()).unclaimed)).collect();
        let mut left: Vec<Vec<u32>> = vec![Vec::new()];
        for p in 1..k {
            let mut l = std::mem::take(&mut unclaimed[p - 1]);
            if p > 1 {
                combine_words(&mut l, &left[p - 1], true);
            }
            left.push(l);
        }
        on_devices(&parts, ordinals, &|p, part| {
            if p == 0 || part.np == 0 {
                return Ok(());
            }
            let g = part.gpu;
            let mut table =
                part.table.take().ok_or_else(|| DataFusionError::Internal("setfusion: bitmap table missing".into()))?;
            let out =
                part.out.take().ok_or_else(|| DataFusionError::Internal("setfusion: selection missing".into()))?;
            table.load_words(g, &left[p], &mut part.stats)?;
            let t = Instant::now();
            match part.keys.take() {
                Some(keys) => table.probe(g, op, &keys.slice.slice(..part.np), &out.slice.slice(..))?,
                None => g.stream_keys(&part.probe, false, &mut part.stats, &mut |keys, first| {
                    table.probe(g, op, keys, &out.slice.slice(first / 32..))
                })?,
            }
            g.synchronize()?;
            part.stats.kernel += t.elapsed();
            g.download_into(&out, part.dst, &mut part.stats)?;
            part.ran = "bitmap";
            trace(&format!("gpu {}: probe range {p} ranked", g.info().ordinal));
            Ok(())
        })?;
        crate::host::drop_later(left);
        trace("gpus: later ranges ranked");
    }
    finish(parts, stats);
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::algo::select::multiset_reference;

    const OPS: [SetOp; 6] = [
        SetOp::Semi,
        SetOp::Anti,
        SetOp::IntersectDistinct,
        SetOp::IntersectAll,
        SetOp::ExceptDistinct,
        SetOp::ExceptAll,
    ];

    fn kept(probe: &[u64], sel: &BooleanBuffer) -> Vec<u64> {
        let mut v: Vec<u64> = sel.set_indices().map(|i| probe[i]).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn rows_of_cuts_across_chunks() {
        let (a, b, c) = ([1u64, 2, 3], [4u64], [5u64, 6]);
        let chunks: [&[u64]; 3] = [&a, &b, &c];
        let cut = |lo, hi| rows_of(&chunks, lo, hi).concat();
        assert_eq!(cut(0, 6), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(cut(2, 5), vec![3, 4, 5]);
        assert_eq!(cut(3, 4), vec![4]);
        assert!(cut(4, 4).is_empty());
        assert_eq!(merge_words(&[&[1, 2], &[4, 2]]), (vec![5, 2], true));
        assert_eq!(merge_words(&[&[1, 2], &[], &[4, 8]]), (vec![5, 10], false));
    }

    /// Every rule on one device standing in for several ('0,0', '0,0,0') and,
    /// where two GPUs are present, on both ('0,1', '0,1,0'): dense keys with
    /// distinct build keys (bitmaps, ranks carried across probe ranges), build
    /// keys repeated within a share or only across shares (the ALL rules split
    /// by hash), sparse keys (semi / anti joins broadcast the build side),
    /// empty sides, and a budget too small to keep any share resident.
    #[test]
    fn rows_split_across_devices_keeps_every_rule() {
        let Some(gpu0) = crate::gpu::test_gpu() else { return };
        let gpu1: Option<Arc<Gpu>> = (crate::gpu::device_count() >= 2).then(|| crate::gpu::gpu(1).ok()).flatten();
        if gpu1.is_none() {
            eprintln!("one GPU: device 0 stands in for every entry of setfusion.devices");
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let n = 300_000usize;
        let mut distinct: Vec<u64> = (0..n as u64).map(|i| 7 + 2 * i).collect();
        for i in (1..distinct.len()).rev() {
            distinct.swap(i, rng.random_range(0..=i));
        }
        let repeated: Vec<u64> = (0..n).map(|_| 7 + rng.random_range(0..n as u64)).collect();
        let across: Vec<u64> = distinct[..n / 2].iter().chain(&distinct[..n / 2]).copied().collect();
        // Probe keys repeat, within and across ranges, and fall below and above the build domain.
        let probe: Vec<u64> = (0..n + 999).map(|_| rng.random_range(0..n as u64 * 2 + 20)).collect();
        let spread = |v: &[u64]| -> Vec<u64> { v.iter().map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect() };
        let (sparse_b, sparse_p) = (spread(&distinct), spread(&probe));
        let empty: Vec<u64> = Vec::new();
        let cases: [(&str, &[u64], &[u64], usize); 7] = [
            ("dense distinct", &distinct, &probe, 0),
            ("dense repeated", &repeated, &probe, 0),
            ("repeated across shares", &across, &probe, 0),
            ("sparse", &sparse_b, &sparse_p, 0),
            ("empty build", &empty, &probe, 0),
            ("empty probe", &distinct, &empty, 0),
            ("tight budget", &distinct, &probe, 3 << 20),
        ];
        let layouts: Vec<Vec<usize>> = if gpu1.is_some() {
            vec![vec![0, 0], vec![0, 0, 0], vec![0, 1], vec![0, 1, 0]]
        } else {
            vec![vec![0, 0], vec![0, 0, 0]]
        };
        for (what, build, probe, limit) in cases {
            let (b1, b2) = build.split_at(build.len() / 3);
            let (p1, p2) = probe.split_at((probe.len() / 2 + 5).min(probe.len()));
            let l0 = gpu0.lease(limit);
            let l1 = gpu1.as_ref().map(|g| g.lease(limit));
            for layout in &layouts {
                let gpus: Vec<&Gpu> =
                    layout.iter().map(|&d| if d == 0 { &*l0 } else { &**l1.as_ref().unwrap() }).collect();
                for op in OPS {
                    let (got, ran) =
                        select_gpus(&gpus, None, op, &[b1, b2], &[p1, p2], &mut TransferStats::default()).unwrap();
                    assert_eq!(got.len(), probe.len(), "{what} {op:?} {layout:?}");
                    assert_eq!(
                        kept(probe, &got),
                        multiset_reference(op, build, probe),
                        "{what} {op:?} on {layout:?}: ran {ran}"
                    );
                    let rows = ran.contains("probe rows in");
                    let want_rows = match what {
                        _ if op == SetOp::ExceptDistinct => false,
                        "empty build" | "empty probe" => false,
                        "dense repeated" | "repeated across shares" => {
                            !matches!(op, SetOp::IntersectAll | SetOp::ExceptAll)
                        }
                        "sparse" => matches!(op, SetOp::Semi | SetOp::Anti),
                        // At 3 MiB the ALL rules' bitmap (counts assumed) does not fit: hash split.
                        "tight budget" => !matches!(op, SetOp::IntersectAll | SetOp::ExceptAll),
                        _ => true,
                    };
                    assert_eq!(rows, want_rows, "{what} {op:?} on {layout:?}: ran {ran}");
                }
            }
        }
    }
}
