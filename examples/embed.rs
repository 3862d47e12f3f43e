//! Embedding setfusion in a Rust application: install it on a session, then
//! use SQL or the DataFrame API as usual.
//!
//! `cargo run --release --example embed`

use datafusion::error::Result;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionContext;

#[tokio::main]
async fn main() -> Result<()> {
    let state = setfusion::install(SessionStateBuilder::new().with_default_features()).build();
    let ctx = SessionContext::new_with_state(state);

    ctx.sql("CREATE TABLE a(k INT) AS VALUES (3),(3),(3),(1),(NULL),(NULL)").await?.collect().await?;
    ctx.sql("CREATE TABLE b(k INT) AS VALUES (3),(1),(1),(NULL)").await?.collect().await?;

    // Exact multiset semantics: {1, 3, NULL} and {3, 3, NULL}.
    ctx.sql("SELECT k FROM a INTERSECT ALL SELECT k FROM b ORDER BY k").await?.show().await?;
    ctx.sql("SELECT k FROM a EXCEPT ALL SELECT k FROM b ORDER BY k").await?.show().await?;

    // Semi join; EXPLAIN shows where it runs (and why, for the CPU).
    ctx.sql("SET setfusion.min_rows = 0").await?.collect().await?;
    ctx.sql("EXPLAIN SELECT k FROM a WHERE k IN (SELECT k FROM b)").await?.show().await?;
    ctx.sql("SELECT k FROM a WHERE k IN (SELECT k FROM b) ORDER BY k").await?.show().await?;
    Ok(())
}
