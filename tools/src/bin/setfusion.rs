//! The `setfusion` command line (see `setfusion --help`).
#[tokio::main]
async fn main() {
    let code = setfusion_tools::cli::main_with_args(std::env::args().collect()).await;
    setfusion::gpu::exit_process(code);
}
