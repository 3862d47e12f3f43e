//! Several GPUs (issue 17 item 4): `SET setfusion.devices` hash-partitions a
//! set operation or semi / anti join by key, one partition per listed device.
//! The answers must equal the CPU backend's with one device, several, or none.
//! Where only one GPU is present, '0,0' and '0,0,0' stand in for two and three
//! devices: the split and the mapping back run as on several GPUs, the
//! partitions taking the one device in turn.

use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion::datagen;

use crate::common::{block_on, gpu_or_skip, shared_device};

const QUERIES: &[&str] = &[
    "SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE k NOT IN (SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a EXCEPT SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b) OR v < 10",
];

async fn answers(ctx: &SessionContext) -> Vec<String> {
    let mut out = Vec::new();
    for q in QUERIES {
        let batches = ctx.sql(q).await.unwrap_or_else(|e| panic!("{q}: {e}")).collect().await.unwrap_or_else(|e| panic!("{q}: {e}"));
        out.push(datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string());
    }
    out
}

#[test]
fn the_same_answers_on_one_device_several_or_none() {
    let _device = shared_device();
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        // Keys with repeats on both sides (the ALL rules' counts must survive the split).
        let n = 400_000;
        let a = Arc::new(datagen::key_table(n, |i| datagen::key_a(i) % 150_000, true, 4).unwrap());
        let b = Arc::new(datagen::key_table(n, |i| datagen::key_b(i) % 200_000, false, 4).unwrap());
        let session = |settings: &[&str]| {
            let (a, b) = (a.clone(), b.clone());
            let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
            async move {
                let ctx = setfusion::context_with_config(SessionConfig::new().with_target_partitions(4));
                ctx.register_table("a", a).unwrap();
                ctx.register_table("b", b).unwrap();
                for s in settings {
                    ctx.sql(&s).await.unwrap().collect().await.unwrap();
                }
                ctx
            }
        };
        let want = answers(&session(&["SET setfusion.strategy = 'cpu'"]).await).await;
        for devices in ["", "0,0", "0,0,0", "all"] {
            let ctx = session(&["SET setfusion.min_rows = 0", &format!("SET setfusion.devices = '{devices}'")]).await;
            let got = answers(&ctx).await;
            for ((q, g), w) in QUERIES.iter().zip(&got).zip(&want) {
                assert_eq!(g, w, "devices '{devices}': {q}");
            }
            if gpu && devices.starts_with("0,0") {
                let parts = devices.split(',').count();
                let analyzed = ctx.sql(&format!("EXPLAIN ANALYZE {}", QUERIES[3])).await.unwrap().collect().await.unwrap();
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&analyzed).unwrap().to_string();
                assert!(text.contains(&format!("{parts} key partitions")), "devices '{devices}':\n{text}");
            }
        }
        // A setting that names no devices is refused when it is made.
        let ctx = session(&[]).await;
        let e = match ctx.sql("SET setfusion.devices = 'gpu0'").await {
            Err(e) => e,
            Ok(df) => df.collect().await.err().expect("an invalid list is refused"),
        };
        assert!(e.to_string().contains("invalid setfusion.devices"), "{e}");
    });
}
