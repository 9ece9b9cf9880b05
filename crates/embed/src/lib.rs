//! The model side of jointspace: a photo becomes a ternary code and a joint vector, a sentence a joint vector.
//! The modules follow the data flow: decode -> prepare -> crops -> vision -> fne -> projection (and hubness, the
//! search offset of a stored image), and tokenize -> text, composed by `pipeline`, the one entry the service
//! calls. `bundle` reads and checks the trained files; `runtime` is the inference backend under vision and text
//! (ONNX Runtime, CPU or CUDA) and `batch` their request batching; `thumbnail` a stored image's small JPEG.
//! It alone depends on ONNX Runtime, and knows nothing of storage, indexes or HTTP.

pub mod batch;
pub mod bundle;
pub mod crops;
pub mod decode;
pub mod fne;
pub mod hubness;
mod labels;
pub mod pipeline;
pub mod prepare;
pub mod projection;
pub mod runtime;
pub mod text;
pub mod thumbnail;
pub mod tokenize;
pub mod vision;

// The shared names under the paths the modules use (`crate::modality`).
use jointspace_core::modality;
