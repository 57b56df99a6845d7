//! The console's page, script and style, built into the binary.

/// One embedded file.
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const INDEX: Asset = Asset {
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("web/index.html"),
};

/// The asset served at `path`, if any. Every page of the console is the
/// same document: it routes on the URL's fragment.
pub fn get(path: &str) -> Option<Asset> {
    match path {
        "/ui" | "/ui/" | "/ui/index.html" => Some(INDEX),
        "/ui/app.js" => Some(Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("web/app.js"),
        }),
        "/ui/app.css" => Some(Asset {
            content_type: "text/css; charset=utf-8",
            body: include_bytes!("web/app.css"),
        }),
        _ => None,
    }
}
