//! Reading text columns of parquet files, the format the Hugging Face Hub serves every dataset
//! in (its `refs/convert/parquet` branch, and most uploads).
//!
//! Only the columns asked for are decoded (a projection of the file schema), so a dataset with
//! large image or audio columns next to its text costs no more than its text. Rows come back in
//! file order. A column may be nested: `translation.de` reads field `de` of the struct column
//! `translation`, as in the WMT datasets.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::{Compression, ConvertedType, LogicalType, Repetition, Type as PhysicalType};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::record::{Field, Row};
use parquet::schema::types::{Type, TypePtr};

use crate::error::{DataError, Result};

/// Every column path of a parquet file (`en`, `translation.de`, ...), in schema order; for
/// error messages that must say what *is* there.
pub fn column_names(path: &Path) -> Result<Vec<String>> {
    let reader = open(path)?;
    let mut out = Vec::new();
    for field in reader.metadata().file_metadata().schema().get_fields() {
        collect_names(field, "", &mut out);
    }
    Ok(out)
}

fn collect_names(t: &TypePtr, prefix: &str, out: &mut Vec<String>) {
    let name = format!("{prefix}{}", t.name());
    let info = t.get_basic_info();
    let is_struct =
        t.is_group() && info.logical_type_ref().is_none() && info.converted_type() == ConvertedType::NONE;
    if is_struct && !t.get_fields().is_empty() {
        for f in t.get_fields() {
            collect_names(f, &format!("{name}."), out);
        }
    } else {
        out.push(name);
    }
}

/// The values of `columns` in every row of `path`: one `Vec` per row, one entry per column
/// (`None` for a null). `key` names the config entry of each column, for errors: a missing
/// column names the columns the file has; a non-text column names its type.
pub fn read_text_columns(path: &Path, columns: &[(&str, &str)]) -> Result<Vec<Vec<Option<String>>>> {
    let reader = open(path)?;
    let schema = reader.metadata().file_metadata().schema();
    let mut projected: Vec<TypePtr> = Vec::new();
    for (key, column) in columns {
        let top = column.split('.').next().unwrap_or(column);
        match schema.get_fields().iter().find(|f| f.name() == top) {
            Some(f) => {
                if !projected.iter().any(|p| p.name() == top) {
                    projected.push(f.clone());
                }
            }
            None => return Err(missing_column(path, key, column)?),
        }
    }
    let projection = Type::group_type_builder(schema.name())
        .with_fields(projected)
        .build()
        .map_err(|e| parquet_error(path, e))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| parquet_error(path, e))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| row_error(path, i, columns, e))?;
        let values = columns
            .iter()
            .map(|(key, column)| text_value(&row, column).map_err(|m| column_error(path, key, column, i, m)))
            .collect::<Result<Vec<_>>>()?;
        out.push(values);
    }
    Ok(out)
}

fn open(path: &Path) -> Result<SerializedFileReader<File>> {
    let file = crate::io::open_regular(
        path,
        "a parquet file is read in place (its footer first), so it must be a regular file",
    )
    .map_err(|e| DataError::Io {
        path: path.to_path_buf(),
        key: None,
        source: e,
        hint: "check that the file is readable".into(),
    })?;
    SerializedFileReader::new(file).map_err(|e| parquet_error(path, e))
}

/// The text at `column` (dotted for nested fields) of one row.
fn text_value(row: &Row, column: &str) -> std::result::Result<Option<String>, String> {
    let mut parts = column.split('.');
    let first = parts.next().unwrap_or(column);
    let mut field = lookup(row, first).ok_or_else(|| "the column is missing from this row".to_string())?;
    for part in parts {
        field = match field {
            Field::Group(g) => lookup(g, part).ok_or_else(|| format!("the struct has no field {part:?}"))?,
            Field::Null => return Ok(None),
            other => {
                return Err(format!(
                    "{part:?} is read from a {} value, not a struct",
                    kind(other)
                ))
            }
        };
    }
    match field {
        Field::Str(s) => Ok(Some(s.clone())),
        Field::Null => Ok(None),
        // Binary columns written without a UTF-8 annotation.
        Field::Bytes(b) => std::str::from_utf8(b.data())
            .map(|s| Some(s.to_string()))
            .map_err(|_| "a binary value that is not UTF-8 text".to_string()),
        other => Err(format!("a {} value, not text; name a string column", kind(other))),
    }
}

/// A short name of a value's type, for errors.
fn kind(field: &Field) -> &'static str {
    match field {
        Field::Bool(_) => "boolean",
        Field::Byte(_) | Field::Short(_) | Field::Int(_) | Field::Long(_) => "integer",
        Field::UByte(_) | Field::UShort(_) | Field::UInt(_) | Field::ULong(_) => "unsigned integer",
        Field::Float16(_) | Field::Float(_) | Field::Double(_) | Field::Decimal(_) => "number",
        Field::Group(_) => "struct",
        Field::ListInternal(_) => "list",
        Field::MapInternal(_) => "map",
        _ => "date/time",
    }
}

fn lookup<'a>(row: &'a Row, name: &str) -> Option<&'a Field> {
    row.get_column_iter()
        .find(|(n, _)| n.as_str() == name)
        .map(|(_, f)| f)
}

fn missing_column(path: &Path, key: &str, column: &str) -> Result<DataError> {
    let present = column_names(path)?;
    Ok(DataError::config(
        format!("data.corpus.{key}"),
        format!(
            "column {column:?} is not in {} (its columns: {})",
            path.display(),
            present.join(", ")
        ),
    ))
}

fn column_error(path: &Path, key: &str, column: &str, row: usize, message: String) -> DataError {
    let present = column_names(path).map(|c| c.join(", ")).unwrap_or_default();
    DataError::config(
        format!("data.corpus.{key}"),
        format!(
            "column {column:?} of {} row {row} holds {message} (the file's columns: {present})",
            path.display()
        ),
    )
}

/// A row that cannot be read: a text value that is not UTF-8 names the row and the columns
/// read; anything else is a [`parquet_error`].
fn row_error(
    path: &Path,
    row: usize,
    columns: &[(&str, &str)],
    e: parquet::errors::ParquetError,
) -> DataError {
    if e.to_string().contains("as String") {
        let (key, _) = columns.first().copied().unwrap_or(("columns", ""));
        return DataError::config(
            format!("data.corpus.{key}"),
            format!(
                "{} row {row}: a text value (of column {}) is not valid UTF-8; re-encode the \
                 dataset's text as UTF-8",
                path.display(),
                columns
                    .iter()
                    .map(|(_, c)| format!("{c:?}"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        );
    }
    parquet_error(path, e)
}

/// The parquet library's account of a failure, in one short line: the bytes some of its
/// messages dump (`Bytes: [...]`) and its type names are left out.
fn library_words(e: &parquet::errors::ParquetError) -> String {
    let message = e.to_string();
    let cut = ["Bytes:", "Error:", " {"]
        .iter()
        .filter_map(|m| message.find(m))
        .min()
        .unwrap_or(message.len());
    let start = message
        .strip_prefix("Parquet error: ")
        .map_or(0, |_| "Parquet error: ".len());
    let short: String = message[start..cut.max(start)].chars().take(160).collect();
    short.trim_end_matches(['.', ' ', ':']).to_string()
}

fn parquet_error(path: &Path, e: parquet::errors::ParquetError) -> DataError {
    let raw = e.to_string();
    let message = library_words(&e);
    let hint = if raw.contains("Disabled feature") {
        "the file uses a compression codec this build does not include (Ember reads snappy, \
         gzip and uncompressed parquet; a build with --features hf-hub reads every codec), or \
         re-save it with snappy compression"
    } else if [
        "EOF",
        "eof",
        "size",
        "Invalid Parquet file",
        "magic",
        "Corrupt",
        "corrupt",
    ]
    .iter()
    .any(|m| raw.contains(m))
    {
        "the file is not complete, valid parquet (truncated, or not a parquet file); download it again"
    } else {
        "the file cannot be read as parquet; check that it is one of the dataset's parquet files"
    };
    DataError::Io {
        path: path.to_path_buf(),
        key: None,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
        hint: hint.into(),
    }
}

/// Writes a snappy-compressed parquet file of optional string columns (`None` is a null), in
/// row groups of `rows_per_group` rows: the shape of a Hugging Face dataset's text columns. A
/// dotted name `g.x` becomes field `x` of the struct column `g` (as the WMT datasets'
/// `translation.de`). The test suites build their dataset fixtures with it.
pub fn write_text_columns(
    path: &Path,
    columns: &[(&str, Vec<Option<&str>>)],
    rows_per_group: usize,
) -> Result<()> {
    let err = |e: parquet::errors::ParquetError| parquet_error(path, e);
    let rows = columns.first().map_or(0, |(_, v)| v.len());
    if columns.iter().any(|(_, v)| v.len() != rows) || rows_per_group == 0 {
        return Err(DataError::arg(
            "columns",
            "every column needs the same number of rows, and rows_per_group must be > 0",
        ));
    }
    let (schema, leaves) = text_schema(columns).map_err(err)?;
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = File::create(path).map_err(|e| DataError::Io {
        path: path.to_path_buf(),
        key: None,
        source: e,
        hint: "check that the folder exists and is writable".into(),
    })?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(err)?;
    for start in (0..rows.max(1)).step_by(rows_per_group) {
        let end = (start + rows_per_group).min(rows);
        let mut group = writer.next_row_group().map_err(err)?;
        for &(i, nested) in &leaves {
            let values = &columns[i].1[start..end];
            // Definition levels: a nested value sits under a present struct (level 1), so a
            // present value is level 2 there, and 1 at the top level.
            let present_level = if nested { 2 } else { 1 };
            let levels: Vec<i16> = values
                .iter()
                .map(|v| {
                    if v.is_some() {
                        present_level
                    } else {
                        present_level - 1
                    }
                })
                .collect();
            let present: Vec<ByteArray> = values.iter().flatten().map(|v| ByteArray::from(*v)).collect();
            let mut column = group
                .next_column()
                .map_err(err)?
                .expect("one writer per schema leaf");
            column
                .typed::<ByteArrayType>()
                .write_batch(&present, Some(&levels), None)
                .map_err(err)?;
            column.close().map_err(err)?;
        }
        group.close().map_err(err)?;
    }
    writer.close().map_err(err)?;
    Ok(())
}

/// A parquet schema, and its leaves in the order the writer asks for them: each as its column's
/// index and whether it is a field of a struct column.
type TextSchema = (Arc<Type>, Vec<(usize, bool)>);

/// The schema of [`write_text_columns`]' columns: nullable strings, a dotted name a struct field.
fn text_schema(columns: &[(&str, Vec<Option<&str>>)]) -> parquet::errors::Result<TextSchema> {
    // Top-level columns in order of first appearance; a struct's fields stay together, so the
    // leaves below are in the schema's depth-first order, the order the writer asks for them.
    let mut tops: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, (name, _)) in columns.iter().enumerate() {
        let top = name.split_once('.').map_or(*name, |(g, _)| g);
        match tops.iter_mut().find(|(t, _)| *t == top) {
            Some((_, leaves)) => leaves.push(i),
            None => tops.push((top, vec![i])),
        }
    }
    let string = |name: &str| {
        Type::primitive_type_builder(name, PhysicalType::BYTE_ARRAY)
            .with_repetition(Repetition::OPTIONAL)
            .with_logical_type(Some(LogicalType::String))
            .build()
            .map(Arc::new)
    };
    let mut fields = Vec::new();
    let mut leaves = Vec::new();
    for (top, idx) in &tops {
        let nested = columns[idx[0]].0.contains('.');
        if nested {
            let inner = idx
                .iter()
                .map(|&i| string(columns[i].0.split_once('.').map_or("", |(_, f)| f)))
                .collect::<parquet::errors::Result<Vec<_>>>()?;
            let group = Type::group_type_builder(top)
                .with_repetition(Repetition::OPTIONAL)
                .with_fields(inner)
                .build()?;
            fields.push(Arc::new(group));
        } else {
            fields.push(string(top)?);
        }
        leaves.extend(idx.iter().map(|&i| (i, nested)));
    }
    let schema = Type::group_type_builder("schema").with_fields(fields).build()?;
    Ok((Arc::new(schema), leaves))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_not_utf8_names_the_file_row_and_key_without_the_library_s_dump() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.parquet");
        let rows = vec![Some("fine"), Some("bad QXQXQX here"), Some("fine")];
        write_text_columns(&path, &[("text", rows)], 10).unwrap();
        // The marker is stored verbatim (a snappy literal, and the column statistics): make it
        // bytes that are not UTF-8.
        let mut bytes = std::fs::read(&path).unwrap();
        let marker = b"QXQXQX";
        let mut patched = 0;
        while let Some(i) = bytes.windows(marker.len()).position(|w| w == marker) {
            bytes[i..i + marker.len()].copy_from_slice(&[0xff, 0xfe, 0xc0, 0xff, 0xfe, 0xc0]);
            patched += 1;
        }
        assert!(patched > 0);
        std::fs::write(&path, bytes).unwrap();
        let e = read_text_columns(&path, &[("columns.text", "text")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.parquet") && e.contains("row 1") && e.contains("not valid UTF-8"),
            "{e}"
        );
        assert!(e.contains("data.corpus.columns.text"), "{e}");
        assert!(
            !e.contains("Bytes") && !e.contains("FromUtf8Error") && !e.contains("re-download"),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_is_not_parquet_says_so_in_one_short_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.parquet");
        std::fs::write(&path, "this is text, not parquet\n".repeat(10)).unwrap();
        let e = read_text_columns(&path, &[("columns.text", "text")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.parquet") && e.contains("parquet"), "{e}");
        assert!(e.len() < 400 && !e.contains('{'), "{e}");
    }
}
