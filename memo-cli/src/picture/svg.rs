//! A minimal SVG writer: the few elements the pictures use, written straight into a string.
//!
//! Coordinates are printed with at most two decimals (a hundredth of a pixel is below what any
//! renderer shows) and without trailing zeros, which keeps files of thousands of rectangles small.
//! Text and attribute values are escaped, so buffer names can never break the document.

use std::fmt::Write;

/// An SVG document being written.
pub struct Svg {
    out: String,
}

/// A number as SVG wants it: at most two decimals, no trailing zeros, no `-0`.
pub fn num(value: f64) -> String {
    if !value.is_finite() {
        return "0".to_string();
    }
    let hundredths = (value * 100.0).round();
    if hundredths == 0.0 {
        return "0".to_string();
    }
    let text = format!("{:.2}", hundredths / 100.0);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `text` with `&`, `<`, `>`, `"` and `'` escaped, safe in element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Where a text's anchor point is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// The text starts at x.
    Start,
    /// The text is centred on x.
    Middle,
    /// The text ends at x.
    End,
}

impl Anchor {
    fn name(self) -> &'static str {
        match self {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        }
    }
}

/// How a line is stroked.
#[derive(Clone, Copy, Debug)]
pub struct Stroke<'a> {
    /// Colour.
    pub colour: &'a str,
    /// Width in pixels.
    pub width: f64,
    /// An SVG dash array (`"6 3"`), or `None` for a solid line.
    pub dash: Option<&'a str>,
}

impl Svg {
    /// An empty document; [`Svg::finish`] gives it its size.
    pub fn new() -> Self {
        Svg { out: String::with_capacity(1 << 16) }
    }

    /// A filled rectangle. `class` marks it for tests and stylesheets; `title` becomes a tooltip.
    #[allow(clippy::too_many_arguments)]
    pub fn rect(
        &mut self,
        x: f64,
        y: f64,
        width: f64,
        height: f64,
        fill: &str,
        class: Option<&str>,
        title: Option<&str>,
    ) {
        let _ = write!(
            self.out,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"",
            num(x),
            num(y),
            num(width.max(0.0)),
            num(height.max(0.0))
        );
        if let Some(class) = class {
            let _ = write!(self.out, " class=\"{class}\"");
        }
        match title {
            Some(title) => {
                let _ = writeln!(self.out, "><title>{}</title></rect>", escape(title));
            }
            None => self.out.push_str("/>\n"),
        }
    }

    /// A straight line.
    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: Stroke) {
        let _ = write!(
            self.out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"{}\"",
            num(x1),
            num(y1),
            num(x2),
            num(y2),
            stroke.colour,
            num(stroke.width)
        );
        if let Some(dash) = stroke.dash {
            let _ = write!(self.out, " stroke-dasharray=\"{dash}\"");
        }
        self.out.push_str("/>\n");
    }

    /// A filled path (`d` is path data built with [`num`]).
    pub fn path(&mut self, d: &str, fill: &str, class: Option<&str>) {
        let _ = write!(self.out, "<path d=\"{d}\" fill=\"{fill}\"");
        if let Some(class) = class {
            let _ = write!(self.out, " class=\"{class}\"");
        }
        self.out.push_str("/>\n");
    }

    /// A line of text. With `halo`, a white outline keeps it readable over the rectangles.
    #[allow(clippy::too_many_arguments)]
    pub fn text(&mut self, x: f64, y: f64, content: &str, anchor: Anchor, size: f64, weight_bold: bool, halo: bool) {
        let _ = write!(self.out, "<text x=\"{}\" y=\"{}\" text-anchor=\"{}\"", num(x), num(y), anchor.name());
        if size != 12.0 {
            let _ = write!(self.out, " font-size=\"{}\"", num(size));
        }
        if weight_bold {
            self.out.push_str(" font-weight=\"bold\"");
        }
        if halo {
            self.out
                .push_str(" stroke=\"#ffffff\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\"");
        }
        let _ = writeln!(self.out, " fill=\"#222222\">{}</text>", escape(content));
    }

    /// Text rotated by -90 degrees about its anchor (a vertical axis title).
    pub fn vertical_text(&mut self, x: f64, y: f64, content: &str) {
        let _ = writeln!(
            self.out,
            "<text x=\"{x}\" y=\"{y}\" text-anchor=\"middle\" transform=\"rotate(-90 {x} {y})\" fill=\"#222222\">{}</text>",
            escape(content),
            x = num(x),
            y = num(y),
        );
    }

    /// Opens a group (`<g>`), optionally with a class and a clip rectangle id. `crisp` turns off
    /// anti-aliasing of its shapes' edges, so rectangles that meet at fractional coordinates show
    /// no seam of background between them.
    pub fn open_group(&mut self, class: Option<&str>, clip: Option<&str>, crisp: bool) {
        self.out.push_str("<g");
        if crisp {
            self.out.push_str(" shape-rendering=\"crispEdges\"");
        }
        if let Some(class) = class {
            let _ = write!(self.out, " class=\"{class}\"");
        }
        if let Some(clip) = clip {
            let _ = write!(self.out, " clip-path=\"url(#{clip})\"");
        }
        self.out.push_str(">\n");
    }

    /// Closes the innermost group.
    pub fn close_group(&mut self) {
        self.out.push_str("</g>\n");
    }

    /// Defines a rectangular clip path named `id`.
    pub fn clip_rect(&mut self, id: &str, x: f64, y: f64, width: f64, height: f64) {
        let _ = writeln!(
            self.out,
            "<defs><clipPath id=\"{id}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath></defs>",
            num(x),
            num(y),
            num(width),
            num(height)
        );
    }

    /// The finished document, `width` x `height` pixels on a white background, titled `title`.
    pub fn finish(self, width: f64, height: f64, title: &str) -> String {
        let mut document = String::with_capacity(self.out.len() + 512);
        let _ = write!(
            document,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
             font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n<title>{}</title>\n\
             <rect width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n",
            escape(title),
            w = num(width),
            h = num(height),
        );
        document.push_str(&self.out);
        document.push_str("</svg>\n");
        document
    }
}

impl Default for Svg {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(1.0), "1");
        assert_eq!(num(1.5), "1.5");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(-0.001), "0");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(num(1200.0), "1200");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        let mut svg = Svg::new();
        svg.text(0.0, 0.0, "a <b>", Anchor::Start, 12.0, false, false);
        let text = svg.finish(10.0, 10.0, "x</title><script>");
        assert!(!text.contains("<script>"));
        assert!(text.contains(">a &lt;b&gt;</text>"));
    }
}
