//! The instance catalog and the GPU table: what each machine the advisor may propose is made
//! of and what it costs. The shipped catalog (`analysis/data/instances.csv`) is compiled into
//! the binary; a user's file in SkyPilot's column names loads the same way, so a catalog
//! exported from SkyPilot works unchanged. Parsing is a pure function over `&str`; a bad cell
//! is an error naming its line and column, never a silently skipped row.

use serde::{Deserialize, Serialize};

/// The catalog that ships with stallscope.
pub const SHIPPED_INSTANCES: &str = include_str!("../../data/instances.csv");
/// The GPU figures that ship with stallscope.
pub const SHIPPED_GPUS: &str = include_str!("../../data/gpus.csv");

/// Why a catalog could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CatalogError {
    /// A required column is absent from the header.
    #[error("line {line}: the header has no column `{column}`")]
    MissingColumn {
        /// 1-based line of the header.
        line: usize,
        /// The column's name.
        column: String,
    },
    /// A cell does not parse.
    #[error("line {line}, column `{column}`: cannot read `{value}` as {expected}")]
    BadCell {
        /// 1-based line.
        line: usize,
        /// The column's name.
        column: String,
        /// The cell as written.
        value: String,
        /// What was expected ("a number", …).
        expected: &'static str,
    },
    /// A rate the model divides by is 0: nothing could be predicted on that row.
    #[error("line {line} ({instance_type}), column `{column}`: a rate of 0 cannot be predicted with (leave the cell empty when the rate is unknown)")]
    ZeroRate {
        /// 1-based line.
        line: usize,
        /// The row's `InstanceType`.
        instance_type: String,
        /// The column's name.
        column: String,
    },
    /// A row has a different number of cells than the header.
    #[error("line {line}: {found} cells where the header has {expected}")]
    Width {
        /// 1-based line.
        line: usize,
        /// Cells found.
        found: usize,
        /// Cells in the header.
        expected: usize,
    },
    /// No header line.
    #[error("the catalog is empty")]
    Empty,
}

/// One instance type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// Provider's name for it (`p4d.24xlarge`).
    pub instance_type: String,
    /// GPU model (`A100`); `None` for a CPU machine.
    pub accelerator: Option<String>,
    /// GPUs per node (0 for a CPU machine).
    pub accelerator_count: u32,
    /// Logical CPUs per node.
    pub vcpus: f64,
    /// GiB of memory per node.
    pub memory_gib: f64,
    /// USD per node-hour, on demand.
    pub price: f64,
    /// USD per node-hour, spot, when known.
    pub spot_price: Option<f64>,
    /// Gbit/s, the node's network, when known.
    pub network_gbps: Option<f64>,
    /// GB/s per GPU between GPUs of a node (NVLink or PCIe), when known.
    pub gpu_link_gbps: Option<f64>,
    /// MB/s, the rate the dataset is read from storage, when known.
    pub storage_mbps: Option<f64>,
    /// Cloud provider.
    pub provider: Option<String>,
    /// Region the prices are for.
    pub region: Option<String>,
    /// Where the figures come from, and when.
    pub source: Option<String>,
}

impl Instance {
    /// Whether it has accelerators.
    pub fn has_gpu(&self) -> bool {
        self.accelerator.is_some() && self.accelerator_count > 0
    }
}

/// One GPU model's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// Model name as the catalog's `AcceleratorName` spells it.
    pub name: String,
    /// TFLOPS, dense BF16/FP16 on tensor cores.
    pub bf16_tflops: f64,
    /// TFLOPS, FP32 without tensor cores.
    pub fp32_tflops: f64,
    /// GB/s, memory bandwidth.
    pub memory_gbps: f64,
    /// GiB of memory.
    pub memory_gib: f64,
    /// Where the figures come from.
    pub source: String,
}

/// Rows of a CSV with their 1-based line numbers, comments (`#`) and blank lines left out.
struct Table<'a> {
    header: Vec<String>,
    header_line: usize,
    rows: Vec<(usize, Vec<String>)>,
    _text: std::marker::PhantomData<&'a str>,
}

/// Splits one CSV line; double quotes group a cell and `""` is a quote.
fn split_line(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cells.last_mut().unwrap().push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

impl<'a> Table<'a> {
    fn parse(text: &'a str) -> Result<Table<'a>, CatalogError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        let (header_line, header) = lines.next().ok_or(CatalogError::Empty)?;
        let header = split_line(header);
        let mut rows = Vec::new();
        for (n, l) in lines {
            let cells = split_line(l);
            if cells.len() != header.len() {
                return Err(CatalogError::Width {
                    line: n,
                    found: cells.len(),
                    expected: header.len(),
                });
            }
            rows.push((n, cells));
        }
        Ok(Table {
            header,
            header_line,
            rows,
            _text: std::marker::PhantomData,
        })
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.header
            .iter()
            .position(|h| h.eq_ignore_ascii_case(name))
    }

    fn required(&self, name: &str) -> Result<usize, CatalogError> {
        self.column(name)
            .ok_or_else(|| CatalogError::MissingColumn {
                line: self.header_line,
                column: name.to_string(),
            })
    }
}

fn text(cells: &[String], col: Option<usize>) -> Option<String> {
    col.map(|c| cells[c].clone()).filter(|s| !s.is_empty())
}

fn number(
    cells: &[String],
    col: Option<usize>,
    line: usize,
    header: &[String],
) -> Result<Option<f64>, CatalogError> {
    let Some(c) = col else { return Ok(None) };
    let v = &cells[c];
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(Some)
        .ok_or_else(|| CatalogError::BadCell {
            line,
            column: header[c].clone(),
            value: v.clone(),
            expected: "a number ≥ 0",
        })
}

/// The optional columns that are rates the model divides by (`NetworkGbps`, `GpuLinkGBps`,
/// `StorageMBps`): empty means unknown, and 0 is refused, since a link or a disk that moves
/// nothing gives no time at all.
const RATE_COLUMNS: [&str; 3] = ["NetworkGbps", "GpuLinkGBps", "StorageMBps"];

/// Reads an instance catalog (SkyPilot's columns, plus the optional ones stallscope knows).
pub fn parse_instances(csv: &str) -> Result<Vec<Instance>, CatalogError> {
    let t = Table::parse(csv)?;
    let ty = t.required("InstanceType")?;
    let acc = t.required("AcceleratorName")?;
    let count = t.required("AcceleratorCount")?;
    let vcpus = t.required("vCPUs")?;
    let mem = t.required("MemoryGiB")?;
    let price = t.required("Price")?;
    let h = &t.header;
    let mut out = Vec::new();
    for (line, cells) in &t.rows {
        let line = *line;
        let need = |col: usize| -> Result<f64, CatalogError> {
            number(cells, Some(col), line, h)?.ok_or_else(|| CatalogError::BadCell {
                line,
                column: h[col].clone(),
                value: String::new(),
                expected: "a number (it is required)",
            })
        };
        let accelerator_count = number(cells, Some(count), line, h)?.unwrap_or(0.0);
        if accelerator_count.fract() != 0.0 {
            return Err(CatalogError::BadCell {
                line,
                column: h[count].clone(),
                value: cells[count].clone(),
                expected: "a whole number",
            });
        }
        for col in RATE_COLUMNS.iter().filter_map(|name| t.column(name)) {
            if number(cells, Some(col), line, h)? == Some(0.0) {
                return Err(CatalogError::ZeroRate {
                    line,
                    instance_type: cells[ty].clone(),
                    column: h[col].clone(),
                });
            }
        }
        out.push(Instance {
            instance_type: cells[ty].clone(),
            accelerator: text(cells, Some(acc)),
            accelerator_count: accelerator_count as u32,
            vcpus: need(vcpus)?,
            memory_gib: need(mem)?,
            price: need(price)?,
            spot_price: number(cells, t.column("SpotPrice"), line, h)?,
            network_gbps: number(cells, t.column("NetworkGbps"), line, h)?,
            gpu_link_gbps: number(cells, t.column("GpuLinkGBps"), line, h)?,
            storage_mbps: number(cells, t.column("StorageMBps"), line, h)?,
            provider: text(cells, t.column("Provider")).or(text(cells, t.column("Cloud"))),
            region: text(cells, t.column("Region")),
            source: text(cells, t.column("Source")),
        });
    }
    Ok(out)
}

/// Reads the GPU table.
pub fn parse_gpus(csv: &str) -> Result<Vec<Gpu>, CatalogError> {
    let t = Table::parse(csv)?;
    let cols =
        ["Gpu", "Bf16Tflops", "Fp32Tflops", "MemoryGBps", "MemoryGiB"].map(|c| t.required(c));
    let [name, bf16, fp32, bw, mem] = cols;
    let (name, bf16, fp32, bw, mem) = (name?, bf16?, fp32?, bw?, mem?);
    let src = t.column("Source");
    let h = &t.header;
    let mut out = Vec::new();
    for (line, cells) in &t.rows {
        let n = |c| number(cells, Some(c), *line, h).map(|x| x.unwrap_or(0.0));
        out.push(Gpu {
            name: cells[name].clone(),
            bf16_tflops: n(bf16)?,
            fp32_tflops: n(fp32)?,
            memory_gbps: n(bw)?,
            memory_gib: n(mem)?,
            source: text(cells, src).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The GPU of that name (case-insensitive), if the table knows it.
pub fn gpu<'a>(gpus: &'a [Gpu], name: &str) -> Option<&'a Gpu> {
    gpus.iter().find(|g| g.name.eq_ignore_ascii_case(name))
}
