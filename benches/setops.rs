//! `cargo bench --bench setops_bench`: see `setfusion_tools::bench::setops`.
#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    setfusion_tools::bench::setops::run().await
}
