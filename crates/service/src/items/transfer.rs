//! Export and import: a collection as JSON lines, and restoring one from them without the CNN.
//!
//! The format (docs/api.md, "Export and import"), one JSON object per line, each with one key naming its kind:
//! a `header`, then one `image` per image (its ternary code, not its vector: the vector is the loaded
//! bundle's projection of the code, as in a reindex), then one `caption` per caption without an image, then an
//! `end` that counts them, so that a file cut short is refused instead of restored in part.

use base64::{Engine, engine::general_purpose::STANDARD};
use bytes::Bytes;
use futures::{Stream, stream};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{CollectionName, Result, Service, ServiceError, TextField};
use crate::{
    fne::TernaryCode,
    store::{
        CollectionRow, EmbeddedCaption, ExportedImage, ImportMark, NewCaption, NewImage,
        Provenance, ReadSnapshot, Store,
    },
};

pub const EXPORT_FORMAT: &str = "jointspace-export";
pub const EXPORT_VERSION: u32 = 1;
/// Images per page read (and per chunk of the stream).
const PAGE: i64 = 256;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ExportLine {
    Header(ExportHeader),
    Image(ImageLine),
    Caption(CaptionLine),
    End(EndLine),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExportHeader {
    /// Always `jointspace-export`.
    pub format: String,
    pub version: u32,
    pub collection: String,
    pub description: String,
    pub exported_at: String,
    /// The collection's text fields and product key, so that an import into a new collection searches as the
    /// exported one did (absent in exports made before they were written: the collection had neither, or
    /// they are lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_fields: Option<Vec<TextField>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ImageLine {
    pub external_id: Option<String>,
    pub metadata: Value,
    pub width: u32,
    pub height: u32,
    /// The packed ternary FNE code (docs/bundle.md), base64.
    pub code: String,
    /// The vision model that made the code: an import needs a bundle with the same one.
    pub vision_id: String,
    /// The bundle whose W made the stored vector (for the record: an import projects under its own).
    pub bundle_id: String,
    #[serde(default)]
    pub content_hash: Option<String>,
    pub created_at: String,
    /// The thumbnail JPEG, base64.
    #[serde(default)]
    pub thumbnail: Option<String>,
    #[serde(default)]
    pub captions: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaptionLine {
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndLine {
    pub images: u64,
    pub captions: u64,
}

impl From<ExportedImage> for ImageLine {
    fn from(i: ExportedImage) -> Self {
        ImageLine {
            external_id: i.external_id,
            metadata: i.metadata,
            width: u32::try_from(i.width).unwrap_or(0),
            height: u32::try_from(i.height).unwrap_or(0),
            code: STANDARD.encode(&i.code),
            vision_id: i.vision_id,
            bundle_id: i.bundle_id,
            content_hash: i.content_hash,
            created_at: i.created_at,
            thumbnail: i.thumbnail.map(|t| STANDARD.encode(t)),
            captions: i.captions,
        }
    }
}

fn line(l: &ExportLine, out: &mut Vec<u8>) {
    // Serialising our own types to a Vec cannot fail.
    if serde_json::to_writer(&mut *out, l).is_ok() {
        out.push(b'\n');
    }
}

enum Phase {
    Header,
    Images(i64),
    Captions(i64),
    End,
    Done,
}

struct Export {
    snap: ReadSnapshot,
    collection: CollectionRow,
    phase: Phase,
    images: u64,
    captions: u64,
}

/// The collection's export, as chunks of JSON lines, read from one point in time. The CLI calls this with the
/// database alone (an export needs no model); the API through `Service::export`.
pub async fn export_collection(
    db: &crate::Database,
    collection: &CollectionName,
) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
    export_from(&db.0, collection).await
}

async fn export_from(
    store: &Store,
    collection: &CollectionName,
) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
    // The row first: an in-memory database has one connection, which the snapshot then holds.
    let collection = store.collection(collection.as_str()).await?;
    let snap = store.read_snapshot().await?;
    let st = Export {
        snap,
        collection,
        phase: Phase::Header,
        images: 0,
        captions: 0,
    };
    Ok(stream::try_unfold(st, |mut st| async move {
        let mut out = Vec::new();
        let id = st.collection.id;
        st.phase = match st.phase {
            Phase::Header => {
                let h = ExportHeader {
                    format: EXPORT_FORMAT.into(),
                    version: EXPORT_VERSION,
                    collection: st.collection.name.clone(),
                    description: st.collection.description.clone(),
                    exported_at: crate::store::codec::now_rfc3339(),
                    text_fields: st.collection.text_fields.clone(),
                    group_by: st.collection.group_by.clone(),
                };
                line(&ExportLine::Header(h), &mut out);
                Phase::Images(0)
            }
            Phase::Images(after) => {
                let page = st.snap.images_page(id, after, PAGE).await?;
                let next = match page.last() {
                    Some(last) if page.len() as i64 == PAGE => Phase::Images(last.id),
                    _ => Phase::Captions(0),
                };
                st.images += page.len() as u64;
                for img in page {
                    line(&ExportLine::Image(img.into()), &mut out);
                }
                next
            }
            Phase::Captions(after) => {
                let page = st.snap.free_captions_page(id, after, PAGE * 4).await?;
                let next = match page.last() {
                    Some((last, _)) if page.len() as i64 == PAGE * 4 => Phase::Captions(*last),
                    _ => Phase::End,
                };
                st.captions += page.len() as u64;
                for (_, text) in page {
                    line(&ExportLine::Caption(CaptionLine { text }), &mut out);
                }
                next
            }
            Phase::End => {
                let end = EndLine {
                    images: st.images,
                    captions: st.captions,
                };
                line(&ExportLine::End(end), &mut out);
                Phase::Done
            }
            Phase::Done => return Ok(None),
        };
        Ok(Some((Bytes::from(out), st)))
    }))
}

impl Service {
    pub async fn export(
        &self,
        collection: &CollectionName,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        export_from(&self.store, collection).await
    }

    /// How many lines of `source` an earlier import into the collection committed.
    pub async fn import_progress(&self, collection: &CollectionName, source: &str) -> Result<i64> {
        let c = self.collection_ref(collection).await?;
        Ok(self.store.import_progress(c.id, source).await?)
    }

    /// Restores exported images without the CNN: each code projected by the loaded bundle (so the bundle's
    /// vision model must be the one that made the codes), captions and text fields embedded by its text
    /// model, in one transaction that also records `mark`.
    pub async fn restore_images(
        &self,
        collection: &CollectionName,
        images: Vec<ImageLine>,
        mark: &ImportMark,
    ) -> Result<Vec<i64>> {
        let c = self.writable_ref(collection).await?;
        let b = self.pipeline.bundle.clone();
        let dim = self.pipeline.projection().fne_dim();
        let mut codes = Vec::with_capacity(images.len());
        let mut thumbs = Vec::with_capacity(images.len());
        for img in &images {
            let (code, thumb) = code_and_thumbnail(img, &b.vision_id, dim)?;
            codes.push(code);
            thumbs.push(thumb);
        }
        let texts: Vec<String> = images.iter().flat_map(|i| i.captions.clone()).collect();
        let mut text_vecs = self.embed_captions(&texts).await?.into_iter();
        let metadatas: Vec<&Value> = images.iter().map(|i| &i.metadata).collect();
        let mut fields = self
            .embed_fields(c.text_fields.as_deref(), &metadatas, &Default::default())
            .await?
            .into_iter();
        let (vectors, offsets) = self
            .pipeline
            .project_codes(codes.clone())
            .await
            .map_err(|e| ServiceError::embed(None, e))?;
        let rows: Vec<NewImage> = images
            .into_iter()
            .zip(codes)
            .zip(vectors.into_iter().zip(offsets))
            .zip(thumbs)
            .map(|(((img, code), (vector, offset)), thumbnail)| NewImage {
                external_id: img.external_id,
                metadata: img.metadata,
                width: img.width,
                height: img.height,
                code: code.packed().to_vec(),
                vector,
                offset,
                captions: img
                    .captions
                    .into_iter()
                    .map(|text| EmbeddedCaption::new(text, text_vecs.next().unwrap_or_default()))
                    .chain(fields.next().unwrap_or_default())
                    .collect(),
                thumbnail,
                content_hash: img.content_hash,
            })
            .collect();
        let prov = Provenance {
            bundle_id: &b.id,
            vision_id: &b.vision_id,
        };
        let ids = self
            .store
            .insert_images(c.id, &rows, prov, Some(mark))
            .await?;
        self.index_added(c.id, rows, &ids)?;
        Ok(ids.into_iter().map(|(id, _)| id).collect())
    }

    /// Free captions of an export, embedded and stored in one transaction that also records `mark`.
    pub async fn restore_captions(
        &self,
        collection: &CollectionName,
        texts: Vec<String>,
        mark: &ImportMark,
    ) -> Result<Vec<i64>> {
        let c = self.writable_ref(collection).await?;
        let vecs = self.embed_captions(&texts).await?;
        let rows: Vec<NewCaption> = texts
            .into_iter()
            .zip(vecs)
            .map(|(text, v)| NewCaption {
                image_id: None,
                caption: EmbeddedCaption::new(text, v),
            })
            .collect();
        let ids = self
            .store
            .insert_captions(c.id, &rows, &self.pipeline.bundle.id, Some(mark))
            .await?;
        self.index_added_captions(c.id, rows, &ids)?;
        Ok(ids)
    }

    /// Sentences to store: their joint vectors and search offsets (none to embed is no call at all).
    async fn embed_captions(&self, texts: &[String]) -> Result<Vec<(Vec<f32>, f32)>> {
        if texts.is_empty() {
            return Ok(vec![]);
        }
        let vectors = self.embed_texts(texts).await?;
        self.with_caption_offsets(vectors).await
    }
}

/// An exported image's code and thumbnail, decoded; refused when another vision model coded it (its code
/// cannot be projected by the loaded bundle's W).
fn code_and_thumbnail(
    img: &ImageLine,
    vision_id: &str,
    dim: usize,
) -> Result<(TernaryCode, Option<Vec<u8>>)> {
    let what = img
        .external_id
        .as_deref()
        .map(|e| format!("image \"{e}\""))
        .unwrap_or_else(|| "an image".into());
    if img.vision_id != vision_id {
        return Err(ServiceError::Invalid(format!(
            "{what} was coded by vision model {}, and the loaded bundle's is {}: its code cannot be \
             projected; import under a bundle with that vision model, or add the photos again",
            img.vision_id, vision_id
        )));
    }
    let raw = STANDARD
        .decode(&img.code)
        .map_err(|e| ServiceError::Invalid(format!("{what}: code is not base64: {e}")))?;
    let code = TernaryCode::from_packed(dim, raw)
        .map_err(|e| ServiceError::Invalid(format!("{what}: {e}")))?;
    let thumbnail = img
        .thumbnail
        .as_deref()
        .map(|t| STANDARD.decode(t))
        .transpose()
        .map_err(|e| ServiceError::Invalid(format!("{what}: thumbnail is not base64: {e}")))?;
    Ok((code, thumbnail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_their_kind_and_read_back() {
        let img = ImageLine {
            external_id: Some("sku-1".into()),
            metadata: serde_json::json!({"a": 1}),
            width: 3,
            height: 4,
            code: "AAE=".into(),
            vision_id: "v".into(),
            bundle_id: "b".into(),
            content_hash: None,
            created_at: "2026-11-25T00:00:00Z".into(),
            thumbnail: None,
            captions: vec!["x".into()],
        };
        let mut out = vec![];
        line(&ExportLine::Image(img.clone()), &mut out);
        line(
            &ExportLine::End(EndLine {
                images: 1,
                captions: 0,
            }),
            &mut out,
        );
        let text = String::from_utf8(out).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("{\"image\":{\"external_id\":\"sku-1\""),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "{\"end\":{\"images\":1,\"captions\":0}}");
        let back: ExportLine = serde_json::from_str(lines[0]).expect("parse");
        assert_eq!(back, ExportLine::Image(img));
        assert!(serde_json::from_str::<ExportLine>("{\"photo\":{}}").is_err());
    }
}
