//! `intersect_families(F, G [, level])` and `intersect_families(F [, level])`:
//! the table function over [`crate::exec::families::FamiliesExec`].
//!
//! F and G are table names (string literals) of tables of sets, one row per
//! set (`id`, `elements` list of integers) or one row per element (`id`,
//! `element`). See the operator's documentation for the levels and rules.
//!
//! ```sql
//! SELECT * FROM intersect_families('f', 'g');                 -- distinct sets, frequency
//! SELECT * FROM intersect_families('f', 'g', 'pairs');        -- left_id, right_id, elements
//! SELECT * FROM intersect_families('prescriptions', 'pairs'); -- self form, left id < right id
//! SELECT * FROM intersect_families('sets', 'counts');         -- left_id, right_id, overlap (MISI)
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::families::{families_schema, FamiliesExec, Layout, Level};

/// The table function (registered by [`crate::install`]).
#[derive(Debug, Default)]
pub struct IntersectFamilies;

pub const NAME: &str = "intersect_families";

impl TableFunctionImpl for IntersectFamilies {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let usage = || {
            DataFusionError::Plan(format!(
                "{NAME}: expected {NAME}('F', 'G' [, level]) or {NAME}('F' [, level]) with table names and level \
                 'distinct' (default), 'pairs', 'all' or 'counts' as string literals"
            ))
        };
        let strings: Vec<String> = args
            .exprs()
            .iter()
            .map(|e| match e {
                Expr::Literal(
                    ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)),
                    _,
                ) => Ok(s.clone()),
                _ => Err(usage()),
            })
            .collect::<Result<_>>()?;
        let is_level = |s: &str| Level::parse(s).is_ok();
        let (names, level) = match strings.as_slice() {
            [f] => (vec![f.clone()], Level::Distinct),
            [f, x] if is_level(x) => (vec![f.clone()], Level::parse(x)?),
            [f, g] => (vec![f.clone(), g.clone()], Level::Distinct),
            [f, g, l] => (vec![f.clone(), g.clone()], Level::parse(l)?),
            _ => return Err(usage()),
        };
        let state = args
            .session()
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| DataFusionError::Plan(format!("{NAME} needs a DataFusion SessionState")))?;
        let tables = names
            .iter()
            .map(|n| {
                let schema = state.schema_for_ref(n.as_str())?;
                let table_name = datafusion::common::TableReference::from(n.as_str()).table().to_string();
                // The in-memory and listing schema providers answer at once; nothing here waits on I/O.
                let t = futures::executor::block_on(schema.table(&table_name))?
                    .ok_or_else(|| DataFusionError::Plan(format!("{NAME}: table '{n}' not found")))?;
                let layout = Layout::of(n, &t.schema())?;
                Ok((t, layout))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(FamiliesTable::new(names, tables, level)))
    }
}

/// The table a call returns: its rows come from [`FamiliesExec`].
#[derive(Debug)]
pub struct FamiliesTable {
    names: Vec<String>,
    tables: Vec<(Arc<dyn TableProvider>, Layout)>,
    level: Level,
    schema: SchemaRef,
}

impl FamiliesTable {
    fn new(names: Vec<String>, tables: Vec<(Arc<dyn TableProvider>, Layout)>, level: Level) -> Self {
        let (l, r) = (&tables[0], tables.get(1).unwrap_or(&tables[0]));
        let (ls, rs) = (l.0.schema(), r.0.schema());
        let (_, schema) = families_schema(level, &ls, l.1, &rs, r.1);
        FamiliesTable { names, tables, level, schema }
    }
}

impl FamiliesTable {
    /// The call's result over these tables (one: the self form), checking each table's layout.
    pub fn try_from_tables(names: Vec<String>, tables: Vec<Arc<dyn TableProvider>>, level: Level) -> Result<Self> {
        if tables.is_empty() || tables.len() > 2 || tables.len() != names.len() {
            return Err(DataFusionError::Plan(format!(
                "{NAME}: expected one or two named tables, got {}",
                tables.len()
            )));
        }
        let tables = names
            .iter()
            .zip(tables)
            .map(|(n, t)| Ok((t.clone(), Layout::of(n, &t.schema())?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::new(names, tables, level))
    }

    /// The tables' names as the call gave them, and their providers.
    pub fn tables(&self) -> impl Iterator<Item = (&str, &Arc<dyn TableProvider>)> {
        self.names.iter().map(String::as_str).zip(self.tables.iter().map(|(t, _)| t))
    }

    pub fn level(&self) -> Level {
        self.level
    }
}

#[async_trait]
impl TableProvider for FamiliesTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let left = self.tables[0].0.scan(state, None, &[], None).await?;
        let right = match self.tables.get(1) {
            Some((t, _)) => Some(t.scan(state, None, &[], None).await?),
            None => None,
        };
        let (ll, rl) = (self.tables[0].1, self.tables.get(1).map_or(self.tables[0].1, |t| t.1));
        let exec: Arc<dyn ExecutionPlan> = Arc::new(FamiliesExec::try_new(left, right, ll, rl, self.level)?);
        debug_assert_eq!(exec.schema(), self.schema, "{:?}", self.names);
        match projection {
            Some(p) if *p != (0..self.schema.fields().len()).collect::<Vec<_>>() => {
                let exprs: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = p
                    .iter()
                    .map(|&i| {
                        let f = self.schema.field(i);
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(f.name(), i)) as _,
                            f.name().clone(),
                        )
                    })
                    .collect();
                Ok(Arc::new(ProjectionExec::try_new(exprs, exec)?))
            }
            _ => Ok(exec),
        }
    }
}
