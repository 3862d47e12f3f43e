//! The set selection where one or both inputs are [`DeviceScanExec`]s: those
//! sides' keys are decoded on the device from their Parquet files
//! ([`crate::scan`]) and never exist as Arrow batches; a host side's keys are
//! encoded and uploaded as usual. Both end as device keys, NULLs are handled
//! by SQL's rules exactly as the host path handles them ([`Selector`]: the
//! non-NULL keys compacted on the device form the keyed core, NULL rows are
//! decided around it), and the keyed core runs on the resident keys
//! ([`crate::algo::select::select_resident`]).

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExprRef;

use super::device_scan::DeviceScanExec;
use super::memory::hold_device;
use super::selection::{coerce_like, forced_strategy, key_columns, Selector};
use crate::algo::select::SetOp;
use crate::config::SetfusionConfig;
use crate::gpu::{self, DeviceBuffer, Gpu, TransferStats};
use crate::keys;
use crate::scan::ScanReport;

/// One input of the selection.
pub(crate) enum Side<'a> {
    /// Keys read by the device from the scan's files.
    Device(&'a DeviceScanExec),
    /// Collected batches and the key expression over them.
    Host(Vec<&'a RecordBatch>, PhysicalExprRef),
}

/// One side's keys on the device.
struct SideKeys {
    keys: DeviceBuffer<u64>,
    n: usize,
    /// Validity (None: no NULL key), on the host and on the device.
    nulls: Option<(NullBuffer, DeviceBuffer<u32>)>,
    report: Option<ScanReport>,
}

impl SideKeys {
    fn null_count(&self) -> usize {
        self.nulls.as_ref().map_or(0, |(n, _)| n.null_count())
    }
    /// The non-NULL keys (all of them when none is NULL), on the device.
    fn core(self, g: &Gpu, stats: &mut TransferStats) -> Result<(DeviceBuffer<u64>, usize)> {
        match &self.nulls {
            None => Ok((self.keys, self.n)),
            Some((_, valid)) => gpu::compact_kept_keys_on_device(g, &self.keys, valid, self.n, stats),
        }
    }
}

/// Validity words (LSB first) as a NULL buffer of `n` rows; None without NULLs.
fn null_buffer(words: Vec<u32>, n: usize) -> Option<NullBuffer> {
    Some(NullBuffer::new(BooleanBuffer::new(Buffer::from_vec(words), 0, n))).filter(|b| b.null_count() > 0)
}

fn side_keys(
    g: &Gpu,
    side: Side<'_>,
    key_type: &DataType,
    keep: Option<(i64, i64)>,
    cache_limit: usize,
    ahead: Option<crate::scan::ReadAhead>,
    stats: &mut TransferStats,
) -> Result<std::result::Result<SideKeys, String>> {
    match side {
        Side::Device(scan) => match crate::scan::scan_to_device(
            g,
            scan.files(),
            scan.column(),
            scan.data_type(),
            keep,
            cache_limit,
            ahead,
            stats,
        )? {
            Ok(d) => Ok(Ok(device_side(g, d, stats)?)),
            Err(why) => Ok(Err(why.0)),
        },
        Side::Host(batches, expr) => {
            let cols = key_columns(&batches, std::slice::from_ref(&expr))?;
            let types = [key_type.clone()];
            let cols = cols.into_iter().map(|c| coerce_like(c, &types)).collect::<Result<Vec<_>>>()?;
            let encoded = keys::encode(&cols, &types, None, true)?;
            let n = encoded.len();
            let (keys, _) = g.upload_keys(&encoded.slices(), stats)?;
            let nulls = match encoded.nulls {
                Some(nb) => {
                    // The validity bits from bit 0, as the device's 32-bit words.
                    let bytes = nb.inner().sliced();
                    let mut words = vec![0u32; n.div_ceil(32)];
                    for (w, c) in words.iter_mut().zip(bytes.as_slice().chunks(4)) {
                        let mut b = [0u8; 4];
                        b[..c.len()].copy_from_slice(c);
                        *w = u32::from_le_bytes(b);
                    }
                    let d = g.upload(&words, stats)?;
                    Some((nb, d))
                }
                None => None,
            };
            Ok(Ok(SideKeys { keys, n, nulls, report: None }))
        }
    }
}

/// A device-scanned side's keys, with its NULLs as a host buffer too.
fn device_side(
    g: &Gpu,
    (decoded, report): (crate::scan::DeviceDecoded, ScanReport),
    stats: &mut TransferStats,
) -> Result<SideKeys> {
    let n = decoded.rows;
    let nulls = match decoded.valid {
        Some(valid) => null_buffer(g.download(&valid, n.div_ceil(32), stats)?, n).map(|b| (b, valid)),
        None => None,
    };
    Ok(SideKeys { keys: decoded.keys, n, nulls, report: Some(report) })
}

fn describe(which: &str, r: &ScanReport) -> String {
    if let Some(hit @ crate::scan::CacheUse::Hit { .. }) = r.cache {
        return format!("{which}: {} rows, {hit} (copied in {:.1} ms)", r.rows, r.upload.as_secs_f64() * 1e3);
    }
    let cache = r.cache.map(|c| format!(", {c}")).unwrap_or_default()
        + &if r.row_groups_pruned > 0 {
            format!(", {} of {} row groups pruned by the build side's key range", r.row_groups_pruned, r.row_groups)
        } else {
            String::new()
        };
    let secs = (r.read + r.upload + r.decode).as_secs_f64().max(1e-9);
    format!(
        "{which}: {} rows, {} pages, {:.1} MB read in {:.1} ms, uploaded in {:.1} ms, decoded in {:.1} ms ({:.1} GB/s of keys end to end)",
        r.rows,
        r.pages,
        r.bytes_read as f64 / 1e6,
        r.read.as_secs_f64() * 1e3,
        r.upload.as_secs_f64() * 1e3,
        r.decode.as_secs_f64() * 1e3,
        r.bytes_decoded as f64 / secs / 1e9,
    ) + if r.decoded_with_other { " (both sides decoded in one launch)" } else { "" }
        + &cache
}

/// The selection of every probe row, with what ran; `Ok(Err(reason))` when a
/// device-scanned side must be read on the host after all (its files hold
/// something the device does not decode).
pub(crate) fn select_device_scanned(
    selector: &Selector,
    cfg: &SetfusionConfig,
    probe: Side<'_>,
    build: Side<'_>,
    key_type: &DataType,
) -> Result<std::result::Result<(BooleanBuffer, String, Vec<(String, ScanReport)>), String>> {
    let device = gpu::gpu(cfg.device).map_err(gpu::GpuError::from)?;
    let g = hold_device(&device, cfg, selector.reservation.as_deref())?;
    let mut stats = TransferStats::default();
    // The build side's files are read on the host while the probe side's
    // are uploaded and decoded (unless the device holds its keys already).
    let ahead = match &build {
        Side::Device(scan)
            if !(cfg.cache_limit.0 > 0
                && crate::scan::is_cached(&g, scan.files(), scan.column(), scan.data_type())) =>
        {
            Some(crate::scan::ReadAhead::start(
                scan.files().to_vec(),
                scan.column().to_string(),
                scan.data_type().clone(),
            ))
        }
        _ => None,
    };
    // Where unmatched probe rows are dropped (IN / EXISTS, INTERSECT [ALL]),
    // probe row groups outside the build side's key range (from its files'
    // statistics) are not read, as DataFusion's dynamic filter would prune
    // them; row groups with NULL keys are always read (INTERSECT keeps NULLs).
    let keep = match (&probe, &build) {
        (Side::Device(_), Side::Device(b))
            if matches!(selector.op, SetOp::Semi | SetOp::IntersectDistinct | SetOp::IntersectAll) =>
        {
            crate::scan::key_range(b.files(), b.column()).unwrap_or(None)
        }
        _ => None,
    };
    // Both sides read from their files (neither in the column cache): one
    // upload buffer and one decode launch for the two, so the launches'
    // tails (their largest pages) overlap. Otherwise side by side.
    let cached =
        |s: &DeviceScanExec| cfg.cache_limit.0 > 0 && crate::scan::is_cached(&g, s.files(), s.column(), s.data_type());
    let (probe, build) = match (&probe, &build) {
        (Side::Device(p), Side::Device(b)) if !cached(p) && !cached(b) => {
            fn side(s: &DeviceScanExec, keep: Option<(i64, i64)>) -> crate::scan::PairSide<'_> {
                crate::scan::PairSide { files: s.files(), column: s.column(), arrow: s.data_type(), keep }
            }
            match crate::scan::scan_pair_to_device(
                &g,
                [side(p, keep), side(b, None)],
                cfg.cache_limit.0,
                ahead,
                &mut stats,
            )? {
                Ok([dp, db]) => (device_side(&g, dp, &mut stats)?, device_side(&g, db, &mut stats)?),
                Err((i, why)) => return Ok(Err(format!("{} side: {}", ["probe", "build"][i], why.0))),
            }
        }
        _ => {
            let probe = match side_keys(&g, probe, key_type, keep, cfg.cache_limit.0, None, &mut stats)? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("probe side: {why}"))),
            };
            let build = match side_keys(&g, build, key_type, None, cfg.cache_limit.0, ahead, &mut stats)? {
                Ok(k) => k,
                Err(why) => return Ok(Err(format!("build side: {why}"))),
            };
            (probe, build)
        }
    };
    let reports: Vec<(String, ScanReport)> = [("probe", &probe.report), ("build", &build.report)]
        .into_iter()
        .filter_map(|(w, r)| r.clone().map(|r| (w.to_string(), r)))
        .collect();
    let notes: Vec<String> = reports.iter().map(|(w, r)| describe(w, r)).collect();
    selector.metrics.device.input_rows.add(probe.n + build.n);
    let n = probe.n;
    let (m, nb) = (probe.null_count(), build.null_count());
    if let Some((sel, ran)) = selector.decided_by_nulls(n, build.n, nb) {
        selector.metrics.device.record(&stats);
        return Ok(Ok((sel, format!("{ran}; device scan {}", notes.join("; ")), reports)));
    }
    let probe_nulls = probe.nulls.as_ref().map(|(b, _)| b.clone());
    let (probe_core, npc) = probe.core(&g, &mut stats)?;
    let (build_core, nbc) = build.core(&g, &mut stats)?;
    let (core, ran) = crate::algo::select::select_resident(
        &g,
        forced_strategy(cfg, false),
        selector.op,
        build_core,
        nbc,
        probe_core,
        npc,
        &mut stats,
    )?;
    selector.metrics.device.record(&stats);
    let sel = match probe_nulls {
        None => core,
        Some(nulls) => {
            let idx: Vec<u32> = nulls.valid_indices().map(|i| i as u32).collect();
            selector.with_null_rows(&core, n, &idx, &|i| nulls.is_null(i), (m, nb))
        }
    };
    Ok(Ok((sel, format!("{ran}; device scan {}", notes.join("; ")), reports)))
}
