// Parts of this file are ported from Apache DataFusion 55.2.0,
// datafusion-sqllogictest: src/engines/datafusion_engine/runner.rs and
// src/engines/datafusion_engine/error.rs.
//
// Licensed to the Apache Software Foundation (ASF) under one
// or more contributor license agreements.  See the NOTICE file
// distributed with this work for additional information
// regarding copyright ownership.  The ASF licenses this file
// to you under the Apache License, Version 2.0 (the
// "License"); you may not use this file except in compliance
// with the License.  You may obtain a copy of the License at
//
//   http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing,
// software distributed under the License is distributed on an
// "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
// KIND, either express or implied.  See the License for the
// specific language governing permissions and limitations
// under the License.

//! The sqllogictest database: a `SessionContext` behind
//! [`sqllogictest::AsyncDB`], with DataFusion's value normalisation and error
//! texts (`DataFusion error: ...`), so `statement error <regex>` records written
//! for DataFusion match unchanged.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::execute_stream;
use datafusion::prelude::SessionContext;
use futures::FutureExt;
use sqllogictest::DBOutput;

use super::normalize::{self, DFColumnType, DFOutput};

/// Errors of the engine, displayed exactly as DataFusion's
/// `DFSqlLogicTestError` does.
#[derive(Debug)]
pub enum SltError {
    /// Error from datafusion.
    DataFusion(DataFusionError),
    /// Error from arrow-rs.
    Arrow(ArrowError),
    /// Generic error (a panic while running a statement, ...).
    Other(String),
}

impl fmt::Display for SltError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // DataFusion's engine maps parser errors through `ctx.sql`, which
            // already wraps them in `DataFusionError::SQL`.
            SltError::DataFusion(e) => write!(f, "DataFusion error: {}", e.strip_backtrace()),
            SltError::Arrow(e) => write!(f, "Arrow error: {e}"),
            SltError::Other(e) => write!(f, "Other Error: {e}"),
        }
    }
}

impl std::error::Error for SltError {}

impl From<DataFusionError> for SltError {
    fn from(e: DataFusionError) -> Self {
        SltError::DataFusion(e)
    }
}

impl From<ArrowError> for SltError {
    fn from(e: ArrowError) -> Self {
        SltError::Arrow(e)
    }
}

/// A sqllogictest connection over a `SessionContext`.
pub struct SltEngine {
    ctx: SessionContext,
    name: &'static str,
    /// `(from, to)` replacements applied to every output cell.
    path_replacements: Vec<(String, String)>,
    /// `(from, to)` replacements applied to the SQL text before running it.
    sql_replacements: Vec<(String, String)>,
}

impl SltEngine {
    pub fn new(ctx: SessionContext, name: &'static str) -> Self {
        Self { ctx, name, path_replacements: vec![], sql_replacements: vec![] }
    }

    pub fn with_path_replacements(mut self, r: Vec<(String, String)>) -> Self {
        self.path_replacements = r;
        self
    }

    pub fn with_sql_replacements(mut self, r: Vec<(String, String)>) -> Self {
        self.sql_replacements = r;
        self
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for SltEngine {
    type Error = SltError;
    type ColumnType = DFColumnType;

    async fn run(&mut self, sql: &str) -> Result<DFOutput, SltError> {
        let mut sql = sql.to_string();
        for (from, to) in &self.sql_replacements {
            if sql.contains(from.as_str()) {
                sql = sql.replace(from.as_str(), to);
            }
        }
        // A panic inside planning or a setfusion operator fails the record, not the run.
        match AssertUnwindSafe(run_query(&self.ctx, &sql, &self.path_replacements)).catch_unwind().await {
            Ok(r) => r,
            Err(p) => Err(SltError::Other(format!("panic: {}", panic_message(p)))),
        }
    }

    fn engine_name(&self) -> &str {
        self.name
    }

    async fn sleep(dur: Duration) {
        // tokio's timer may not be enabled in every build; a blocking sleep
        // is fine for the rare `sleep` record.
        std::thread::sleep(dur);
    }

    async fn shutdown(&mut self) {}
}

async fn run_query(
    ctx: &SessionContext,
    sql: &str,
    path_replacements: &[(String, String)],
) -> Result<DFOutput, SltError> {
    let df = ctx.sql(sql).await?;
    let task_ctx = std::sync::Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await?;
    let schema = plan.schema();

    let stream = execute_stream(plan, task_ctx)?;
    let types = normalize::convert_schema_to_types(stream.schema().fields());
    let results = collect(stream).await?;
    let rows = normalize::convert_batches(&schema, results, path_replacements)?;

    if rows.is_empty() && types.is_empty() {
        Ok(DBOutput::StatementComplete(0))
    } else {
        Ok(DBOutput::Rows { types, rows })
    }
}
