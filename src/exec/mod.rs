//! DataFusion `ExecutionPlan`s: one operator per file, the plan node separate from its stream.
pub mod set_select;
pub mod similarity_join;
