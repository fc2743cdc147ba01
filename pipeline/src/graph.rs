//! The dataset graph: every dataset and flow the pipeline's SQL files define, what each flow
//! reads, and the order an update runs them in.
//!
//! ```text
//! files ─► parse_pipeline_script ─► datasets   streaming tables, materialized views,
//!                                              temporary views (by name, case-insensitive)
//!                                  ─► flows     a streaming table's own query is its flow
//!                                              (named after the table); CREATE FLOW adds
//!                                              append or once flows into a streaming table;
//!                                              a materialized view's query is its flow
//!       ─► check                  two definitions of one name, a flow into what is not a
//!                                 streaming table, a table no flow writes, a cycle, nothing
//!                                 to run (Spark's error classes where it has them)
//!       ─► stages                 flows in dependency order: each stage's flows read only
//!                                 datasets earlier stages finished, so they run concurrently
//! ```
//!
//! A temporary view is not stored: a flow reading it reads what the view reads. A name no
//! dataset has is outside the pipeline (a source, a table of the session): planning the flow
//! finds out whether it exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use weir_common::ClassifiedError;
use weir_planner::auto_cdc::auto_cdc_input;
use weir_planner::pipeline::{
    CreateAutoCdcFlow, PipelineStatement, TimeTravel, dataset_reads, parse_pipeline_script,
};
use weir_planner::statement::{CreateStreamingTable, Statement};

/// What kind of dataset a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetKind {
    /// A streaming table: a Delta table fed by flows, each with a checkpoint.
    StreamingTable,
    /// A materialized view: a Delta table recomputed by its batch query in every update.
    MaterializedView,
    /// A named query, not stored.
    TemporaryView,
}

impl DatasetKind {
    /// As Spark names the kinds in its errors.
    pub fn label(&self) -> &'static str {
        match self {
            Self::StreamingTable => "STREAMING TABLE",
            Self::MaterializedView => "MATERIALIZED VIEW",
            Self::TemporaryView => "VIEW",
        }
    }
}

/// A dataset the pipeline defines.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The name as written.
    pub name: String,
    /// Its kind.
    pub kind: DatasetKind,
    /// The file that defines it.
    pub file: PathBuf,
    /// A streaming table's declaration (format, location, options, columns, partitioning).
    pub table: Option<CreateStreamingTable>,
    /// A view's query (temporary or materialized).
    pub query: Option<String>,
}

/// How a flow runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowKind {
    /// A streaming query appending to its table, batch after batch.
    Append,
    /// One batch, the first time (and again after a full refresh).
    Once,
    /// A materialized view's batch query, recomputed every update.
    Complete,
}

/// A flow: a query writing one dataset.
#[derive(Debug, Clone)]
pub struct Flow {
    /// The flow's name (a streaming table's own flow has the table's name).
    pub name: String,
    /// The dataset it writes.
    pub target: String,
    /// How it runs.
    pub kind: FlowKind,
    /// Its query, with weir's rewrites applied.
    pub query: String,
    /// The file that defines it.
    pub file: PathBuf,
    /// The pipeline's datasets it reads (through temporary views too), by key.
    pub reads: BTreeSet<String>,
    /// The earlier table versions it reads (`VERSION AS OF`, `TIMESTAMP AS OF`).
    pub time_travel: Vec<TimeTravel>,
    /// An AUTO CDC flow's statement: `query` then reads its source with the sequence, delete
    /// and truncate columns AUTO CDC works from (`weir_planner::auto_cdc::auto_cdc_input`).
    pub auto_cdc: Option<CreateAutoCdcFlow>,
}

/// `name` of a source written `STREAM(name)` or `STREAM name`.
fn streamed_name(source: &str) -> Option<String> {
    let rest = source.trim();
    let head = rest.get(..6)?;
    if !head.eq_ignore_ascii_case("stream") {
        return None;
    }
    let rest = rest[6..].trim();
    let rest = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(rest)
        .trim();
    let plain = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    plain.then(|| rest.to_string())
}

/// The pipeline's datasets and flows, checked.
#[derive(Debug, Clone)]
pub struct Graph {
    /// By lower-cased name.
    pub datasets: BTreeMap<String, Dataset>,
    /// In definition order.
    pub flows: Vec<Flow>,
}

fn key(name: &str) -> String {
    name.to_ascii_lowercase()
}

fn duplicate(class: &'static str, message: String) -> ClassifiedError {
    ClassifiedError::new(class, "42710", message)
}

impl Graph {
    /// Reads every file of `files` and builds the graph; every problem found is returned, each
    /// naming its file.
    pub fn from_files(files: &[PathBuf]) -> Result<Self, Vec<ClassifiedError>> {
        let mut sources = vec![];
        let mut errors = vec![];
        for f in files {
            match std::fs::read_to_string(f) {
                Ok(text) => sources.push((f.clone(), text)),
                Err(e) => errors.push(ClassifiedError::new(
                    "PIPELINE_LIBRARY_FILE_NOT_FOUND",
                    "42K03",
                    format!("Cannot read the pipeline file '{}': {e}.", f.display()),
                )),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Self::from_sources(
            &sources
                .iter()
                .map(|(p, t)| (p.as_path(), t.as_str()))
                .collect::<Vec<_>>(),
        )
    }

    /// The graph of the SQL `sources` (file, text).
    pub fn from_sources(sources: &[(&Path, &str)]) -> Result<Self, Vec<ClassifiedError>> {
        let mut errors = vec![];
        let mut datasets: BTreeMap<String, Dataset> = BTreeMap::new();
        let mut flows: Vec<Flow> = vec![];
        let in_file = |file: &Path, e: ClassifiedError| ClassifiedError {
            message: format!("{}: {}", file.display(), e.message),
            ..e
        };
        // Defines `d`; false (and an error) when its name is taken.
        let mut define = |d: Dataset, errors: &mut Vec<ClassifiedError>| -> bool {
            if let Some(first) = datasets.get(&key(&d.name)) {
                errors.push(duplicate(
                    "PIPELINE_DUPLICATE_IDENTIFIERS.DATASET",
                    format!(
                        "'{}' is defined twice: as a {} in {} and as a {} in {}. Give each \
                         dataset one definition; to feed one table from several queries, \
                         declare it once and add a CREATE FLOW per query.",
                        d.name,
                        first.kind.label(),
                        first.file.display(),
                        d.kind.label(),
                        d.file.display()
                    ),
                ));
                false
            } else {
                datasets.insert(key(&d.name), d);
                true
            }
        };
        for (file, text) in sources {
            let statements = match parse_pipeline_script(text) {
                Ok(s) => s,
                Err(e) => {
                    errors.push(in_file(file, e));
                    continue;
                }
            };
            for s in statements {
                match s {
                    PipelineStatement::StreamingTable(t) => {
                        let own = match &t.auto_cdc {
                            // DBSQL's `CREATE STREAMING TABLE t FLOW AUTO CDC ...`.
                            Some(cdc) => Some(Flow {
                                name: t.name.clone(),
                                target: t.name.clone(),
                                kind: FlowKind::Append,
                                query: auto_cdc_input(cdc),
                                file: file.to_path_buf(),
                                reads: BTreeSet::new(),
                                time_travel: vec![],
                                auto_cdc: Some(cdc.as_ref().clone()),
                            }),
                            None => t.query.clone().map(|query| Flow {
                                name: t.name.clone(),
                                target: t.name.clone(),
                                kind: FlowKind::Append,
                                query,
                                file: file.to_path_buf(),
                                reads: BTreeSet::new(),
                                time_travel: vec![],
                                auto_cdc: None,
                            }),
                        };
                        let table = Dataset {
                            name: t.name.clone(),
                            kind: DatasetKind::StreamingTable,
                            file: file.to_path_buf(),
                            query: None,
                            table: Some(t),
                        };
                        if define(table, &mut errors) {
                            flows.extend(own);
                        }
                    }
                    PipelineStatement::MaterializedView(mv) => {
                        let own = Flow {
                            name: mv.name.clone(),
                            target: mv.name.clone(),
                            kind: FlowKind::Complete,
                            query: mv.query.clone(),
                            file: file.to_path_buf(),
                            reads: BTreeSet::new(),
                            time_travel: mv.time_travel,
                            auto_cdc: None,
                        };
                        let view = Dataset {
                            name: mv.name,
                            kind: DatasetKind::MaterializedView,
                            file: file.to_path_buf(),
                            table: None,
                            query: Some(mv.query),
                        };
                        if define(view, &mut errors) {
                            flows.push(own);
                        }
                    }
                    PipelineStatement::TemporaryView(v) => {
                        let view = Dataset {
                            name: v.name,
                            kind: DatasetKind::TemporaryView,
                            file: file.to_path_buf(),
                            table: None,
                            query: Some(v.query),
                        };
                        define(view, &mut errors);
                    }
                    PipelineStatement::Flow(f) => flows.push(Flow {
                        name: f.name,
                        target: f.target,
                        kind: if f.once {
                            FlowKind::Once
                        } else {
                            FlowKind::Append
                        },
                        query: f.query,
                        file: file.to_path_buf(),
                        reads: BTreeSet::new(),
                        time_travel: f.time_travel,
                        auto_cdc: None,
                    }),
                    PipelineStatement::AutoCdcFlow(f) if f.ignore_null_updates => {
                        errors.push(in_file(
                            file,
                            ClassifiedError::new(
                                "UNSUPPORTED_FEATURE.AUTO_CDC_IGNORE_NULL_UPDATES",
                                "0A000",
                                format!(
                                    "Flow '{}' asks for IGNORE NULL UPDATES, which this weir \
                                     does not apply yet (a null in an upsert overwrites the \
                                     stored value). Remove the clause, or fill the nulls from \
                                     the target before the flow.",
                                    f.name
                                ),
                            ),
                        ))
                    }
                    PipelineStatement::AutoCdcFlow(f) => flows.push(Flow {
                        name: f.name.clone(),
                        target: f.target.clone(),
                        kind: if f.once {
                            FlowKind::Once
                        } else {
                            FlowKind::Append
                        },
                        query: auto_cdc_input(&f),
                        file: file.to_path_buf(),
                        reads: BTreeSet::new(),
                        time_travel: vec![],
                        auto_cdc: Some(f),
                    }),
                    PipelineStatement::Other(other) => {
                        let what = match &other {
                            Statement::Insert { table, .. } => format!("INSERT INTO {table}"),
                            Statement::Sql(sql) => sql.chars().take(60).collect(),
                            Statement::CreateStreamingTable(t) => t.name.clone(),
                        };
                        errors.push(in_file(
                            file,
                            ClassifiedError::new(
                                "UNSUPPORTED_PIPELINE_STATEMENT",
                                "0A000",
                                format!(
                                    "'{what}' is not a dataset or flow definition. A pipeline's \
                                     files hold CREATE STREAMING TABLE, CREATE MATERIALIZED \
                                     VIEW, CREATE TEMPORARY VIEW and CREATE FLOW; settings go in \
                                     the spec's configuration."
                                ),
                            ),
                        ));
                    }
                }
            }
        }
        // An AUTO CDC flow reading `STREAM(v)` of a temporary view reads the view, whose query
        // streams (Databricks' form; the view is a named query, not a stream of its own).
        for f in &mut flows {
            if let Some(cdc) = &mut f.auto_cdc
                && let Some(name) = streamed_name(&cdc.source)
                && datasets
                    .get(&key(&name))
                    .is_some_and(|d| d.kind == DatasetKind::TemporaryView)
            {
                cdc.source = name;
                f.query = auto_cdc_input(cdc);
            }
        }
        let mut graph = Graph { datasets, flows };
        graph.check(&mut errors);
        if errors.is_empty() {
            Ok(graph)
        } else {
            Err(errors)
        }
    }

    /// The datasets `query` reads, through temporary views, by key.
    fn reads_of(&self, query: &str) -> Result<BTreeSet<String>, ClassifiedError> {
        let mut out = BTreeSet::new();
        let mut todo: Vec<String> = dataset_reads(query)?
            .into_iter()
            .map(|r| key(&r.name))
            .collect();
        let mut seen_views = BTreeSet::new();
        while let Some(k) = todo.pop() {
            match self.datasets.get(&k) {
                Some(d) if d.kind == DatasetKind::TemporaryView => {
                    if seen_views.insert(k.clone())
                        && let Some(q) = &d.query
                    {
                        todo.extend(dataset_reads(q)?.into_iter().map(|r| key(&r.name)));
                    }
                }
                Some(_) => {
                    out.insert(k);
                }
                None => {}
            }
        }
        Ok(out)
    }

    fn check(&mut self, errors: &mut Vec<ClassifiedError>) {
        let mut flow_names: BTreeMap<String, &Flow> = BTreeMap::new();
        for f in &self.flows {
            if let Some(first) = flow_names.get(&key(&f.name)) {
                errors.push(duplicate(
                    "PIPELINE_DUPLICATE_IDENTIFIERS.FLOW",
                    format!(
                        "Flow '{}' is defined twice (into '{}' in {} and into '{}' in {}): each \
                         flow needs its own name, which names its checkpoint.",
                        f.name,
                        first.target,
                        first.file.display(),
                        f.target,
                        f.file.display()
                    ),
                ));
            } else {
                flow_names.insert(key(&f.name), f);
            }
        }
        for f in &self.flows {
            match self.datasets.get(&key(&f.target)) {
                None => errors.push(ClassifiedError::new(
                    "TABLE_OR_VIEW_NOT_FOUND",
                    "42P01",
                    format!(
                        "Flow '{}' ({}) writes '{}', which no file of the pipeline defines: \
                         declare it with CREATE STREAMING TABLE {}.",
                        f.name,
                        f.file.display(),
                        f.target,
                        f.target
                    ),
                )),
                Some(d)
                    if f.kind != FlowKind::Complete && d.kind != DatasetKind::StreamingTable =>
                {
                    errors.push(ClassifiedError::new(
                        "PIPELINE_FLOW_TARGET_NOT_A_STREAMING_TABLE",
                        "42809",
                        format!(
                            "Flow '{}' writes '{}', a {}: flows write streaming tables; a \
                             materialized view has its own query.",
                            f.name,
                            d.name,
                            d.kind.label()
                        ),
                    ));
                }
                _ => {}
            }
        }
        // AUTO CDC flows into one table must agree on what a row is.
        let mut cdc_targets: BTreeMap<String, &Flow> = BTreeMap::new();
        for f in &self.flows {
            let Some(cdc) = &f.auto_cdc else { continue };
            match cdc_targets
                .get(&key(&f.target))
                .and_then(|g| g.auto_cdc.as_ref().map(|c| (g, c)))
            {
                None => {
                    cdc_targets.insert(key(&f.target), f);
                }
                Some((first, c)) => {
                    let keys =
                        |c: &CreateAutoCdcFlow| c.keys.iter().map(|k| key(k)).collect::<Vec<_>>();
                    if keys(c) != keys(cdc) || c.scd_type != cdc.scd_type {
                        errors.push(ClassifiedError::new(
                            "INVALID_AUTO_CDC_FLOW",
                            "42K06",
                            format!(
                                "AUTO CDC flows '{}' and '{}' both write '{}' but with other \
                                 KEYS or SCD types ({} and {}): every AUTO CDC flow into a \
                                 table gives the same keys and type.",
                                first.name,
                                f.name,
                                f.target,
                                c.keys.join(", "),
                                cdc.keys.join(", ")
                            ),
                        ));
                    }
                }
            }
        }
        for f in &self.flows {
            if f.auto_cdc.is_none() && cdc_targets.contains_key(&key(&f.target)) {
                errors.push(ClassifiedError::new(
                    "INVALID_AUTO_CDC_FLOW",
                    "42K06",
                    format!(
                        "Flow '{}' appends to '{}', which AUTO CDC flows keep by key: its rows \
                         would bypass the keys. Make it an AUTO CDC flow too, or write another \
                         table.",
                        f.name, f.target
                    ),
                ));
            }
        }
        for d in self.datasets.values() {
            if d.kind == DatasetKind::StreamingTable
                && !self.flows.iter().any(|f| key(&f.target) == key(&d.name))
            {
                errors.push(ClassifiedError::new(
                    "PIPELINE_DATASET_WITHOUT_FLOW",
                    "0A000",
                    format!(
                        "Streaming table '{}' ({}) has no flow writing to it: give it AS query, \
                         or add CREATE FLOW ... AS INSERT INTO {} BY NAME ...",
                        d.name,
                        d.file.display(),
                        d.name
                    ),
                ));
            }
        }
        if !self
            .datasets
            .values()
            .any(|d| d.kind != DatasetKind::TemporaryView)
        {
            errors.push(ClassifiedError::new(
                "RUN_EMPTY_PIPELINE",
                "42617",
                "The pipeline defines no streaming table or materialized view, so an update \
                 has nothing to run: add one to a file its spec's libraries include.",
            ));
        }
        let mut reads = vec![];
        for f in &self.flows {
            match self.reads_of(&f.query) {
                Ok(r) => reads.push(r),
                Err(e) => {
                    errors.push(ClassifiedError {
                        message: format!("Flow '{}' ({}): {}", f.name, f.file.display(), e.message),
                        ..e
                    });
                    reads.push(BTreeSet::new());
                }
            }
        }
        for (f, r) in self.flows.iter_mut().zip(reads) {
            f.reads = r;
        }
        if errors.is_empty()
            && let Err(e) = self.stages()
        {
            errors.push(e);
        }
    }

    /// The flows in the order an update runs them: each stage's flows (indices into
    /// `flows`) read only datasets whose flows all ran in earlier stages.
    pub fn stages(&self) -> Result<Vec<Vec<usize>>, ClassifiedError> {
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut left: Vec<usize> = (0..self.flows.len()).collect();
        let mut stages = vec![];
        let writes = |k: &str| {
            self.flows
                .iter()
                .enumerate()
                .filter(|(_, f)| key(&f.target) == k)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        while !left.is_empty() {
            let ready: Vec<usize> = left
                .iter()
                .copied()
                .filter(|&i| {
                    self.flows[i]
                        .reads
                        .iter()
                        .all(|k| done.contains(k) || writes(k).is_empty())
                })
                .collect();
            if ready.is_empty() {
                let names: Vec<String> = left
                    .iter()
                    .map(|&i| {
                        let f = &self.flows[i];
                        format!(
                            "'{}' (reads {})",
                            f.name,
                            f.reads.iter().cloned().collect::<Vec<_>>().join(", ")
                        )
                    })
                    .collect();
                return Err(ClassifiedError::new(
                    "PIPELINE_CIRCULAR_DEPENDENCY",
                    "42P17",
                    format!(
                        "These flows read each other's tables in a circle, so none can run \
                         first: {}. Break the circle: a dataset cannot depend on itself \
                         through others.",
                        names.join("; ")
                    ),
                ));
            }
            left.retain(|i| !ready.contains(i));
            stages.push(ready);
            // A dataset is done once every flow into it has run.
            for k in self.datasets.keys() {
                let w = writes(k);
                if !w.is_empty() && w.iter().all(|i| !left.contains(i)) {
                    done.insert(k.clone());
                }
            }
        }
        Ok(stages)
    }
}

impl Graph {
    /// The graph as a person reads it: each stage's flows, with their kind, target and what
    /// they read.
    pub fn describe(&self) -> Result<String, ClassifiedError> {
        use std::fmt::Write;
        let mut out = String::new();
        let tables = self
            .datasets
            .values()
            .filter(|d| d.kind != DatasetKind::TemporaryView)
            .count();
        let _ = writeln!(
            out,
            "{} dataset(s) ({} stored), {} flow(s):",
            self.datasets.len(),
            tables,
            self.flows.len()
        );
        for (n, stage) in self.stages()?.iter().enumerate() {
            let _ = writeln!(out, "  stage {}:", n + 1);
            for &i in stage {
                let f = &self.flows[i];
                let kind = match (f.kind, &f.auto_cdc) {
                    (FlowKind::Append, Some(c)) => format!("AUTO CDC, SCD type {}", c.scd_type),
                    (FlowKind::Once, Some(c)) => {
                        format!("AUTO CDC once, SCD type {}", c.scd_type)
                    }
                    (FlowKind::Append, None) => "append".into(),
                    (FlowKind::Once, None) => "once".into(),
                    (FlowKind::Complete, _) => "materialized view".into(),
                };
                let reads = if f.reads.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", reads {}",
                        f.reads.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                };
                let _ = writeln!(out, "    {} → {} ({kind}{reads})", f.name, f.target);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Result<Graph, Vec<ClassifiedError>> {
        let sources: Vec<(&Path, &str)> = files.iter().map(|(p, t)| (Path::new(*p), *t)).collect();
        Graph::from_sources(&sources)
    }

    fn classes(files: &[(&str, &str)]) -> Vec<&'static str> {
        graph(files)
            .expect_err("the graph is refused")
            .iter()
            .map(|e| e.class)
            .collect()
    }

    fn stage_names(g: &Graph) -> Vec<Vec<String>> {
        g.stages()
            .unwrap()
            .into_iter()
            .map(|s| {
                let mut names: Vec<String> =
                    s.into_iter().map(|i| g.flows[i].name.clone()).collect();
                names.sort();
                names
            })
            .collect()
    }

    #[test]
    fn flows_run_in_stages_after_the_datasets_they_read() {
        let g = graph(&[
            (
                "a.sql",
                "CREATE STREAMING TABLE raw AS SELECT * FROM STREAM rate();
                 CREATE STREAMING TABLE orders;
                 CREATE FLOW us AS INSERT INTO orders BY NAME SELECT * FROM STREAM raw;
                 CREATE FLOW eu AS INSERT INTO orders BY NAME SELECT * FROM STREAM raw;",
            ),
            (
                "b.sql",
                "CREATE TEMPORARY VIEW recent AS SELECT * FROM orders WHERE value > 1;
                 CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n FROM recent;
                 CREATE STREAMING TABLE other AS SELECT * FROM STREAM rate();
                 CREATE FLOW backfill AS INSERT INTO ONCE orders BY NAME SELECT * FROM archive;",
            ),
        ])
        .unwrap();
        assert_eq!(
            stage_names(&g),
            [
                vec!["backfill".to_string(), "other".into(), "raw".into()],
                vec!["eu".into(), "us".into()],
                vec!["totals".into()],
            ]
        );
        let totals = g.flows.iter().find(|f| f.name == "totals").unwrap();
        assert_eq!(totals.reads, BTreeSet::from(["orders".to_string()]));
        assert_eq!(totals.kind, FlowKind::Complete);
        let backfill = g.flows.iter().find(|f| f.name == "backfill").unwrap();
        assert_eq!(backfill.kind, FlowKind::Once);
    }

    #[test]
    fn auto_cdc_flows_into_one_table_agree_on_keys_and_are_not_mixed_with_appends() {
        let graph = Graph::from_sources(&[(
            Path::new("cdc.sql"),
            "CREATE STREAMING TABLE customers;
             CREATE FLOW changes AS AUTO CDC INTO customers FROM STREAM cdc KEYS (id)
             APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq;
             CREATE FLOW snapshot AS AUTO CDC ONCE INTO customers FROM snap KEYS (ID)
             SEQUENCE BY 0;",
        )])
        .unwrap();
        assert_eq!(graph.flows[0].kind, FlowKind::Append);
        assert_eq!(graph.flows[1].kind, FlowKind::Once);
        // DBSQL's form: the table's own flow, named after it.
        let dbsql = Graph::from_sources(&[(
            Path::new("cdc.sql"),
            "CREATE STREAMING TABLE customers FLOW AUTO CDC FROM STREAM cdc KEYS (id)
             SEQUENCE BY seq STORED AS SCD TYPE 2;",
        )])
        .unwrap();
        assert_eq!(dbsql.flows.len(), 1);
        assert_eq!(dbsql.flows[0].name, "customers");
        assert_eq!(
            dbsql.flows[0].auto_cdc.as_ref().map(|c| c.scd_type),
            Some(2)
        );
        assert_eq!(
            graph.flows[0].query,
            "SELECT *, (seq) AS __weir_cdc_sequence, COALESCE((op = 'DELETE'), false) AS \
             __weir_cdc_delete, false AS __weir_cdc_truncate FROM STREAM(cdc)"
        );
        assert_eq!(
            classes(&[(
                "cdc.sql",
                "CREATE STREAMING TABLE customers;
                 CREATE FLOW a AS AUTO CDC INTO customers FROM STREAM cdc KEYS (id)
                 SEQUENCE BY seq;
                 CREATE FLOW b AS AUTO CDC INTO customers FROM STREAM cdc KEYS (name)
                 SEQUENCE BY seq;
                 CREATE FLOW c AS INSERT INTO customers BY NAME SELECT * FROM STREAM cdc;"
            )]),
            ["INVALID_AUTO_CDC_FLOW", "INVALID_AUTO_CDC_FLOW"]
        );
        assert_eq!(
            classes(&[(
                "cdc.sql",
                "CREATE STREAMING TABLE customers;
                 CREATE FLOW a AS AUTO CDC INTO customers FROM STREAM cdc KEYS (id)
                 IGNORE NULL UPDATES SEQUENCE BY seq;"
            )]),
            [
                "UNSUPPORTED_FEATURE.AUTO_CDC_IGNORE_NULL_UPDATES",
                "PIPELINE_DATASET_WITHOUT_FLOW"
            ]
        );
    }

    #[test]
    fn every_structural_problem_is_reported_with_its_class() {
        assert_eq!(
            classes(&[
                (
                    "a.sql",
                    "CREATE STREAMING TABLE t AS SELECT * FROM STREAM rate()"
                ),
                ("b.sql", "CREATE MATERIALIZED VIEW T AS SELECT 1"),
            ]),
            ["PIPELINE_DUPLICATE_IDENTIFIERS.DATASET"]
        );
        assert_eq!(
            classes(&[(
                "a.sql",
                "CREATE STREAMING TABLE t;
                 CREATE FLOW f AS INSERT INTO t BY NAME SELECT * FROM STREAM rate();
                 CREATE FLOW F AS INSERT INTO t BY NAME SELECT * FROM STREAM rate();"
            )]),
            ["PIPELINE_DUPLICATE_IDENTIFIERS.FLOW"]
        );
        assert_eq!(
            classes(&[(
                "a.sql",
                "CREATE MATERIALIZED VIEW mv AS SELECT 1;
                 CREATE FLOW f AS INSERT INTO nowhere BY NAME SELECT * FROM STREAM rate();
                 CREATE FLOW g AS INSERT INTO mv BY NAME SELECT * FROM STREAM rate();
                 CREATE STREAMING TABLE empty;"
            )]),
            [
                "TABLE_OR_VIEW_NOT_FOUND",
                "PIPELINE_FLOW_TARGET_NOT_A_STREAMING_TABLE",
                "PIPELINE_DATASET_WITHOUT_FLOW"
            ]
        );
        assert_eq!(
            classes(&[("a.sql", "CREATE TEMPORARY VIEW v AS SELECT 1")]),
            ["RUN_EMPTY_PIPELINE"]
        );
        assert_eq!(
            classes(&[(
                "a.sql",
                "SET x = 1; CREATE MATERIALIZED VIEW mv AS SELECT 1"
            )]),
            ["UNSUPPORTED_PIPELINE_STATEMENT"]
        );
        assert_eq!(
            classes(&[("a.sql", "CREATE FLOW f AS SELECT 1")]),
            ["PARSE_SYNTAX_ERROR", "RUN_EMPTY_PIPELINE"]
        );
        let cycle = graph(&[(
            "a.sql",
            "CREATE STREAMING TABLE a AS SELECT * FROM STREAM b;
             CREATE TEMPORARY VIEW via AS SELECT * FROM a;
             CREATE STREAMING TABLE b AS SELECT * FROM STREAM via;
             CREATE STREAMING TABLE c AS SELECT * FROM STREAM rate();",
        )])
        .unwrap_err();
        assert_eq!(cycle.len(), 1);
        assert_eq!(cycle[0].class, "PIPELINE_CIRCULAR_DEPENDENCY");
        assert!(
            cycle[0].message.contains("'a' (reads b)")
                && cycle[0].message.contains("'b' (reads a)"),
            "{}",
            cycle[0].message
        );
    }
}
