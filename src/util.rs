//! Small helpers every layer may use: the trace timeline and one-line errors.

use datafusion::error::DataFusionError;

/// With SETFUSION_TRACE set, print one timeline event to stderr (ms since
/// the first event of the process): where a query's time goes between its
/// operators and the runtime, which per-operator metrics cannot show.
pub fn trace(what: &str) {
    static EPOCH: std::sync::OnceLock<Option<std::time::Instant>> = std::sync::OnceLock::new();
    if let Some(epoch) = EPOCH.get_or_init(|| crate::env::trace().then(std::time::Instant::now)) {
        eprintln!("trace {:10.2} ms {what}", epoch.elapsed().as_secs_f64() * 1e3);
    }
}

/// Is SETFUSION_TRACE set? (A trace point that must wait for the device
/// to say when its work ended asks first, so an untraced run never waits.)
pub fn tracing() -> bool {
    crate::env::trace()
}

/// One line, for stderr and EXPLAIN: DataFusion errors can span lines.
pub fn one_line(e: &DataFusionError) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}
