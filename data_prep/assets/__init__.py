"""Package data: offline copies of datasets (each with its licence). A package so the default
package-data globs (*.jsonl, LICENSE, *.md) ship it."""
