//! `cargo bench --bench setops_bench`: see `setfusion::bench::setops`.
#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    setfusion::bench::setops::run().await
}
