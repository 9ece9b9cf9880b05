//! Adding images given by URL beside (or instead of) bytes: check the request, fetch the URLs
//! (`crate::fetch`, bounded per server), then add what came through `add_images`. The caller does not control
//! what a URL serves, so an image given by URL fails alone: it is reported and the others are stored, unless
//! the caller asks for all or nothing. An image given as bytes fails the request, as it always has.

use bytes::Bytes;
use serde_json::Value;

use crate::fetch::{FetchError, Fetcher, redacted};
use crate::{AddedImage, CollectionName, ImageInput, ImportMark, Result, Service, ServiceError};

pub enum ImageSource {
    Bytes(Bytes),
    Url(String),
}

pub struct ImageItem {
    pub source: ImageSource,
    pub external_id: Option<String>,
    pub metadata: Option<Value>,
    pub captions: Vec<String>,
}

/// An image given by URL that was not added, and why (`error` names no position: `index` is it).
pub struct ItemFailure {
    pub index: usize,
    pub url: String,
    pub error: ServiceError,
}

/// What an add did: the images stored, each with its position in the request, and the URL images that
/// failed. Nothing is stored when `added` is empty.
pub struct AddReport {
    pub added: Vec<(usize, AddedImage)>,
    pub failed: Vec<ItemFailure>,
}

/// An item waiting to be added: its position in the request, its URL if it had one, and the rest.
struct Pending {
    index: usize,
    url: Option<String>,
    bytes: Bytes,
    external_id: Option<String>,
    metadata: Option<Value>,
    captions: Vec<String>,
}

impl Pending {
    fn input(&self) -> ImageInput {
        ImageInput {
            bytes: self.bytes.clone(),
            external_id: self.external_id.clone(),
            metadata: self.metadata.clone(),
            captions: self.captions.clone(),
        }
    }
}

impl Service {
    /// A URL's bytes, its outcome counted in `jointspace_url_fetches_total`.
    pub(crate) async fn fetch_counted(
        &self,
        fetcher: &Fetcher,
        url: &str,
    ) -> std::result::Result<Bytes, FetchError> {
        let r = fetcher.fetch(url).await;
        self.metrics
            .url_fetched(r.as_ref().map_or_else(FetchError::kind, |_| "ok"));
        r
    }

    /// Adds images given as bytes or by URL (refused when the service has no fetcher: URL ingest off); an
    /// import's `mark` commits with them.
    pub async fn add_image_items(
        &self,
        collection: &CollectionName,
        items: Vec<ImageItem>,
        all_or_nothing: bool,
        mark: Option<&ImportMark>,
    ) -> Result<AddReport> {
        let several = items.len() > 1;
        let urls = items
            .iter()
            .filter(|i| matches!(i.source, ImageSource::Url(_)))
            .count();
        if urls == 0 {
            return self.add_byte_items(collection, items, mark).await;
        }
        let Some(fetcher) = self.opts.url_fetcher.as_deref() else {
            return Err(url_ingest_off(&items));
        };
        self.check_item_request(collection, &items).await?;
        let (pending, failed) = self.fetch_items(fetcher, items).await;
        if !failed.is_empty() && (all_or_nothing || pending.is_empty()) {
            return Ok(AddReport {
                added: vec![],
                failed,
            });
        }
        self.add_fetched(collection, pending, failed, several, all_or_nothing, mark)
            .await
    }

    /// A request with no URLs: added as it always was, failing as a whole.
    async fn add_byte_items(
        &self,
        collection: &CollectionName,
        items: Vec<ImageItem>,
        mark: Option<&ImportMark>,
    ) -> Result<AddReport> {
        let inputs = items
            .into_iter()
            .map(|it| ImageInput {
                bytes: match it.source {
                    ImageSource::Bytes(b) => b,
                    ImageSource::Url(_) => Bytes::new(),
                },
                external_id: it.external_id,
                metadata: it.metadata,
                captions: it.captions,
            })
            .collect();
        let added = self.add_images_marked(collection, inputs, mark).await?;
        Ok(AddReport {
            added: added.into_iter().enumerate().collect(),
            failed: vec![],
        })
    }

    /// Everything the request itself may be refused for, before any fetch (and with the request's
    /// positions, which the failures after fetching would shift).
    async fn check_item_request(
        &self,
        collection: &CollectionName,
        items: &[ImageItem],
    ) -> Result<()> {
        self.collection_ref(collection).await?;
        let shapes: Vec<ImageInput> = items
            .iter()
            .map(|it| ImageInput {
                bytes: Bytes::new(),
                external_id: it.external_id.clone(),
                metadata: it.metadata.clone(),
                captions: vec![],
            })
            .collect();
        self.check_images(&shapes)?;
        let texts: Vec<&String> = items.iter().flat_map(|i| &i.captions).collect();
        self.check_caption_count(texts.len())?;
        self.pipeline
            .tokenize(texts)
            .map_err(|(i, e)| ServiceError::Text {
                index: Some(i),
                source: e,
            })?;
        Ok(())
    }

    /// Fetches the URL items (all at once; the fetcher bounds them): those that came through wait to be
    /// added, those that did not are failures.
    async fn fetch_items(
        &self,
        fetcher: &Fetcher,
        items: Vec<ImageItem>,
    ) -> (Vec<Pending>, Vec<ItemFailure>) {
        let fetched = futures::future::join_all(items.iter().map(|it| async move {
            match &it.source {
                ImageSource::Bytes(b) => Ok(b.clone()),
                ImageSource::Url(u) => self.fetch_counted(fetcher, u).await,
            }
        }))
        .await;
        let mut pending = Vec::with_capacity(items.len());
        let mut failed = Vec::new();
        for ((index, it), r) in items.into_iter().enumerate().zip(fetched) {
            let url = match it.source {
                ImageSource::Url(u) => Some(u),
                ImageSource::Bytes(_) => None,
            };
            match r {
                Ok(bytes) => pending.push(Pending {
                    index,
                    url,
                    bytes,
                    external_id: it.external_id,
                    metadata: it.metadata,
                    captions: it.captions,
                }),
                Err(source) => {
                    let url = url.unwrap_or_default();
                    tracing::info!(index, url = %redacted(&url), error = %source, "URL ingest: image not fetched");
                    failed.push(ItemFailure {
                        index,
                        url: url.clone(),
                        error: ServiceError::Fetch {
                            index: None,
                            url,
                            source: Box::new(source),
                        },
                    });
                }
            }
        }
        (pending, failed)
    }

    /// Adds the fetched items. A URL's bytes that do not decode drop that item and the rest go again:
    /// decoding comes before any inference or write, so a retry costs only the others' decoding.
    async fn add_fetched(
        &self,
        collection: &CollectionName,
        mut pending: Vec<Pending>,
        mut failed: Vec<ItemFailure>,
        several: bool,
        all_or_nothing: bool,
        mark: Option<&ImportMark>,
    ) -> Result<AddReport> {
        loop {
            let inputs = pending.iter().map(Pending::input).collect();
            match self.add_images_marked(collection, inputs, mark).await {
                Ok(added) => {
                    failed.sort_by_key(|f| f.index);
                    return Ok(AddReport {
                        added: pending.iter().map(|p| p.index).zip(added).collect(),
                        failed,
                    });
                }
                Err(ServiceError::Decode { index, source }) => {
                    let p = pending.remove(index.unwrap_or(0));
                    let Some(url) = p.url else {
                        return Err(ServiceError::Decode {
                            index: several.then_some(p.index),
                            source,
                        });
                    };
                    tracing::info!(index = p.index, url = %redacted(&url), error = %source, "URL ingest: fetched bytes are not a usable image");
                    failed.push(ItemFailure {
                        index: p.index,
                        url,
                        error: ServiceError::Decode {
                            index: None,
                            source,
                        },
                    });
                    if all_or_nothing || pending.is_empty() {
                        failed.sort_by_key(|f| f.index);
                        return Ok(AddReport {
                            added: vec![],
                            failed,
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The error for a request with URLs when URL ingest is off: it names the first URL.
fn url_ingest_off(items: &[ImageItem]) -> ServiceError {
    let (index, url) = items
        .iter()
        .enumerate()
        .find_map(|(i, it)| match &it.source {
            ImageSource::Url(u) => Some((i, u.clone())),
            ImageSource::Bytes(_) => None,
        })
        .unwrap_or_default();
    ServiceError::Fetch {
        index: Some(index),
        url,
        source: Box::new(FetchError::Off),
    }
}
