//! Writing a plot drawn with plotters as SVG or PNG.
//!
//! plotters draws the SVG; a PNG is that SVG rendered by resvg, with an embedded subset of DejaVu
//! Sans (Latin-1; see `font/LICENSE-DejaVu`), so no system font is needed. (plotters' own bitmap
//! text needs one of its font features, which would also apply to criterion's plots in this
//! workspace and leave them without a font.)

use std::path::Path;
use std::sync::Arc;

use plotters::coord::Shift;
use plotters::prelude::*;

/// The embedded font (family "DejaVu Sans").
static FONT: &[u8] = include_bytes!("font/DejaVuSans-subset.ttf");
/// Its family name.
const FONT_FAMILY: &str = "DejaVu Sans";

/// The plot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The file name's extension is neither `.svg` nor `.png`.
    #[error("cannot plot to {0}: the file name must end in .svg or .png")]
    Format(String),
    /// The SVG could not be rendered to a bitmap (a bug).
    #[error("cannot render the plot as PNG: {0}")]
    Render(String),
    /// Drawing or writing failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

/// The image formats a plot can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// A bitmap.
    Png,
}

/// The format a path asks for (by extension, case-insensitive).
pub fn format_of(path: &Path) -> Result<Format, PlotError> {
    match path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .as_deref()
    {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(PlotError::Format(path.display().to_string())),
    }
}

/// Draw a plot of `size` pixels with `draw` and write it to `path` (`.svg` or `.png`).
pub fn write<F>(path: &Path, size: (u32, u32), draw: F) -> Result<(), PlotError>
where
    F: for<'a> FnOnce(
        &DrawingArea<SVGBackend<'a>, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<std::io::Error>>,
{
    let format = format_of(path)?;
    let draw_err = |e: String| PlotError::Draw {
        path: path.display().to_string(),
        message: e,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root).map_err(|e| draw_err(e.to_string()))?;
        root.present().map_err(|e| draw_err(e.to_string()))?;
    }
    let bytes = match format {
        Format::Svg => svg.into_bytes(),
        Format::Png => png_of(&svg)?,
    };
    std::fs::write(path, bytes).map_err(|e| draw_err(e.to_string()))
}

/// Render an SVG document to PNG bytes with the embedded font.
fn png_of(svg: &str) -> Result<Vec<u8>, PlotError> {
    let mut fonts = resvg::usvg::fontdb::Database::new();
    fonts.load_font_data(FONT.to_vec());
    fonts.set_sans_serif_family(FONT_FAMILY);
    let options = resvg::usvg::Options {
        font_family: FONT_FAMILY.to_string(),
        fontdb: Arc::new(fonts),
        ..resvg::usvg::Options::default()
    };
    let tree =
        resvg::usvg::Tree::from_str(svg, &options).map_err(|e| PlotError::Render(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| PlotError::Render("empty image".into()))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| PlotError::Render(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_text_is_drawn_with_the_embedded_font() {
        let svg = r#"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60"><text x="5" y="45" font-family="sans-serif" font-size="40">Ready</text></svg>"#;
        let png = png_of(svg).unwrap();
        let img = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        let dark = img.pixels().iter().filter(|p| p.red() < 100).count();
        assert!(dark > 200, "text was drawn: {dark} dark pixels");
        let blank =
            png_of(r#"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60"></svg>"#)
                .unwrap();
        let img = resvg::tiny_skia::Pixmap::decode_png(&blank).unwrap();
        assert_eq!(img.pixels().iter().filter(|p| p.red() < 100).count(), 0);
    }
}
