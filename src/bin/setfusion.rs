//! The `setfusion` command line (see `setfusion --help`).
#[tokio::main]
async fn main() {
    let code = setfusion::cli::main_with_args(std::env::args().collect()).await;
    std::process::exit(code);
}
