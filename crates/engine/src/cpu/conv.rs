//! A 2-d convolution without dilation on the CPU, as one custom autodiff
//! op: the path of every convolution whose input needs a gradient (all but a
//! network's first). burn's own takes the input gradient through a transposed
//! convolution and the weight gradient through a convolution with the batch as
//! channels, after transposing and repacking both serially; on resnet18 that made
//! the step 2-2.5x slower than PyTorch's.
//!
//! Here the batch goes in chunks of whole samples ([`conv_samples_per_chunk`], the
//! plan's rule) on rayon's threads. Forward, per chunk: the im2col rows of its
//! samples in the weight's (C, kh, kw) order (built in a per-thread buffer from each
//! sample's padded image), one product with the weight as it is, and the result
//! written back channel-major (a grouped convolution: a product per group, on its
//! block of each row). Only x and the weight are kept, as PyTorch keeps
//! them: the backward rebuilds each chunk's rows, adds the weight gradient
//! `dYᵀ x rows` into one sum per thread and takes the rows' gradient `dY x W`, which
//! it adds back onto the windows they came from (col2im) in the chunk's input
//! gradient.

use crate::cpu::tensor::{
    Ad, FlexDevice, FlexT, Strided, add_partials, assume_init, contiguous, finish_op, from_vec,
    gemm_into, one_piece_per_thread, uninit, values,
};
use batchfit_plan::rules::{
    CONV_MAX_SAMPLE_COLS_BYTES, ConvCpuPath, conv_cpu_path, conv_samples_per_chunk,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The sizes of one convolution.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    b: usize,
    c: usize,
    h: usize,
    w: usize,
    co: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    pads: [(usize, usize); 2],
    oh: usize,
    ow: usize,
    groups: usize,
}

impl Geometry {
    /// Elements of one im2col row: C channels of kh·kw taps.
    fn k(&self) -> usize {
        self.kh * self.kw * self.c
    }
    /// A group's share of a row (its channels' taps, one contiguous block) and of the
    /// output channels.
    fn per_group(&self) -> (usize, usize) {
        (self.k() / self.groups, self.co / self.groups)
    }
    fn spatial(&self) -> usize {
        self.oh * self.ow
    }
    fn padded(&self) -> (usize, usize) {
        (
            self.h + self.pads[0].0 + self.pads[0].1,
            self.w + self.pads[1].0 + self.pads[1].1,
        )
    }
    fn image(&self) -> usize {
        self.c * self.h * self.w
    }
    /// A 1x1 convolution with stride 1 and no padding: the image is its own im2col.
    fn pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.stride == [1, 1]
            && self.pads.iter().all(|&(a, b)| a == 0 && b == 0)
    }
    /// The plan's path for this convolution (`conv_cpu_path`).
    fn path(&self) -> ConvCpuPath {
        conv_cpu_path(self.spatial(), self.groups, self.pointwise())
    }

    /// The plan's chunk, smaller when that leaves a thread of the pool without one.
    fn samples_per_chunk(&self) -> usize {
        let per_thread = self.b.div_ceil(rayon::current_num_threads().max(1));
        conv_samples_per_chunk(self.spatial())
            .min(per_thread)
            .max(1)
    }

    /// The im2col rows of group `j` of `images` (NCHW samples) into `cols`
    /// `[samples·OH·OW, k / groups]`, in the weight's (C, kh, kw) order, so the group's
    /// filters are the product's matrix as they are; `padded` holds the group's channels
    /// of a padded image, its border zero.
    fn im2col(&self, images: &[f32], j: usize, cols: &mut [f32], padded: &mut [f32]) {
        let (kg, _) = self.per_group();
        let (kw, plane) = (self.kw, self.h * self.w);
        let (hp, wp) = self.padded();
        let channels = self.c / self.groups;
        for (image, out) in images
            .chunks_exact(self.image())
            .zip(cols.chunks_exact_mut(self.spatial() * kg))
        {
            let group = &image[j * channels * plane..(j + 1) * channels * plane];
            for (src, dst) in group
                .chunks_exact(plane)
                .zip(padded.chunks_exact_mut(hp * wp))
            {
                for (y, line) in src.chunks_exact(self.w).enumerate() {
                    let at = (y + self.pads[0].0) * wp + self.pads[1].0;
                    dst[at..at + self.w].copy_from_slice(line);
                }
            }
            for (pos, row) in out.chunks_exact_mut(kg).enumerate() {
                let (y, xo) = (
                    pos / self.ow * self.stride[0],
                    pos % self.ow * self.stride[1],
                );
                for (ch, taps) in row.chunks_exact_mut(self.kh * kw).enumerate() {
                    for (i, part) in taps.chunks_exact_mut(kw).enumerate() {
                        let start = ch * hp * wp + (y + i) * wp + xo;
                        part.copy_from_slice(&padded[start..start + kw]);
                    }
                }
            }
        }
    }

    /// The unfolded taps of one ungrouped sample (`image`, CHW) into `cols`
    /// `[C·kh·kw, OH·OW]`: row (c, i, j) holds tap (i, j) of channel c at every output
    /// position, so `W x cols` is the sample's output planes. `padded` holds the padded
    /// image, its border zero.
    fn unfold(&self, image: &[f32], cols: &mut [f32], padded: &mut [f32]) {
        let (hp, wp) = self.padded();
        let (oh, ow, [sh, sw]) = (self.oh, self.ow, self.stride);
        for (src, dst) in image
            .chunks_exact(self.h * self.w)
            .zip(padded.chunks_exact_mut(hp * wp))
        {
            for (y, line) in src.chunks_exact(self.w).enumerate() {
                let at = (y + self.pads[0].0) * wp + self.pads[1].0;
                dst[at..at + self.w].copy_from_slice(line);
            }
        }
        let mut rows = cols.chunks_exact_mut(oh * ow);
        for plane in padded.chunks_exact(hp * wp) {
            for i in 0..self.kh {
                for j in 0..self.kw {
                    let row = rows.next().expect("cols holds C·kh·kw rows");
                    for (oy, out) in row.chunks_exact_mut(ow).enumerate() {
                        let line = &plane[(oy * sh + i) * wp + j..];
                        if sw == 1 {
                            out.copy_from_slice(&line[..ow]);
                        } else {
                            for (o, v) in out.iter_mut().zip(line.iter().step_by(sw)) {
                                *o = *v;
                            }
                        }
                    }
                }
            }
        }
    }

    /// One ungrouped sample's taps `[C·kh·kw, OH·OW]`: the image itself for a pointwise
    /// convolution, else [`Geometry::unfold`] into the scratch.
    fn taps<'a>(&self, pointwise: bool, image: &'a [f32], s: &'a mut Scratch) -> &'a [f32] {
        if pointwise {
            return image;
        }
        self.unfold(image, &mut s.cols, &mut s.padded);
        &s.cols
    }

    /// Adds the taps' gradient `dcols` `[C·kh·kw, OH·OW]` back onto their windows: the
    /// gradient of one ungrouped sample `dx` (CHW, every element written). `padded` is
    /// scratch, left zeroed.
    fn fold(&self, dcols: &[f32], dx: &mut [MaybeUninit<f32>], padded: &mut [f32]) {
        let (hp, wp) = self.padded();
        let (ow, [sh, sw]) = (self.ow, self.stride);
        padded.fill(0.0);
        let mut rows = dcols.chunks_exact(self.oh * ow);
        for plane in padded.chunks_exact_mut(hp * wp) {
            for i in 0..self.kh {
                for j in 0..self.kw {
                    let row = rows.next().expect("dcols holds C·kh·kw rows");
                    for (oy, part) in row.chunks_exact(ow).enumerate() {
                        let line = &mut plane[(oy * sh + i) * wp + j..];
                        if sw == 1 {
                            for (d, v) in line[..ow].iter_mut().zip(part) {
                                *d += v;
                            }
                        } else {
                            for (d, v) in line.iter_mut().step_by(sw).zip(part) {
                                *d += v;
                            }
                        }
                    }
                }
            }
        }
        for (dst, src) in dx
            .chunks_exact_mut(self.h * self.w)
            .zip(padded.chunks_exact(hp * wp))
        {
            for (y, line) in dst.chunks_exact_mut(self.w).enumerate() {
                let at = (y + self.pads[0].0) * wp + self.pads[1].0;
                line.write_copy_of_slice(&src[at..at + self.w]);
            }
        }
        padded.fill(0.0);
    }

    /// Adds group `j`'s rows `dcols` `[samples·OH·OW, k / groups]` back onto their
    /// windows: the gradient of the group's channels of the samples' images `dx` (NCHW,
    /// each of those elements written);
    /// `padded` is scratch for the group's channels of a padded image, left zeroed for
    /// [`Geometry::im2col`], whose border must be zero.
    fn col2im(&self, dcols: &[f32], j: usize, dx: &mut [MaybeUninit<f32>], padded: &mut [f32]) {
        let (kg, _) = self.per_group();
        let (kw, plane) = (self.kw, self.h * self.w);
        let (hp, wp) = self.padded();
        let channels = self.c / self.groups;
        for (rows, image) in dcols
            .chunks_exact(self.spatial() * kg)
            .zip(dx.chunks_exact_mut(self.image()))
        {
            // im2col leaves an image in it; the sums start from zero.
            padded.fill(0.0);
            for (pos, row) in rows.chunks_exact(kg).enumerate() {
                let (y, xo) = (
                    pos / self.ow * self.stride[0],
                    pos % self.ow * self.stride[1],
                );
                for (ch, taps) in row.chunks_exact(self.kh * kw).enumerate() {
                    for (i, part) in taps.chunks_exact(kw).enumerate() {
                        let start = ch * hp * wp + (y + i) * wp + xo;
                        for (d, s) in padded[start..start + kw].iter_mut().zip(part) {
                            *d += s;
                        }
                    }
                }
            }
            let group = &mut image[j * channels * plane..(j + 1) * channels * plane];
            for (dst, src) in group
                .chunks_exact_mut(plane)
                .zip(padded.chunks_exact(hp * wp))
            {
                for (y, line) in dst.chunks_exact_mut(self.w).enumerate() {
                    let at = (y + self.pads[0].0) * wp + self.pads[1].0;
                    line.write_copy_of_slice(&src[at..at + self.w]);
                }
            }
            padded.fill(0.0);
        }
    }
}

/// Per-thread buffers of one chunk.
struct Scratch {
    padded: Vec<f32>,
    cols: Vec<f32>,
    rows: Vec<f32>,
}

impl Scratch {
    /// The buffers of `g`'s path (the plan's `conv_cpu_scratch`).
    fn new(g: &Geometry) -> Scratch {
        let (hp, wp) = g.padded();
        let padded = vec![0.0; hp * wp * g.c / g.groups];
        match g.path() {
            ConvCpuPath::Chunks => {
                let r = g.samples_per_chunk() * g.spatial();
                Scratch {
                    padded,
                    cols: vec![0.0; r * g.per_group().0],
                    rows: vec![0.0; r * g.co],
                }
            }
            ConvCpuPath::PerSample { pointwise: true } => Scratch {
                padded: Vec::new(),
                cols: Vec::new(),
                rows: Vec::new(),
            },
            ConvCpuPath::PerSample { pointwise: false } => Scratch {
                padded,
                cols: vec![0.0; g.k() * g.spatial()],
                rows: Vec::new(),
            },
        }
    }
}

/// `conv2d(x, w)` without bias or dilation, in `groups` groups, as the custom op (`None`
/// off the CPU or for a sample whose im2col matrix, for one group, exceeds the plan's
/// [`CONV_MAX_SAMPLE_COLS_BYTES`]: burn's convolution bounds its own buffers).
pub fn conv2d_cpu(
    x: Tensor<4>,
    w: Tensor<4>,
    stride: [usize; 2],
    pads: [(usize, usize); 2],
    groups: usize,
) -> Option<Tensor<4>> {
    let [b, c, h, wd] = x.dims();
    let [co, ci, kh, kw] = w.dims();
    let (hp, wp) = (h + pads[0].0 + pads[0].1, wd + pads[1].0 + pads[1].1);
    let grouped = groups > 0 && c.is_multiple_of(groups) && co.is_multiple_of(groups);
    if !grouped || ci * groups != c || hp < kh || wp < kw || stride.contains(&0) {
        return None;
    }
    let g = Geometry {
        b,
        c,
        h,
        w: wd,
        co,
        kh,
        kw,
        stride,
        pads,
        oh: (hp - kh) / stride[0] + 1,
        ow: (wp - kw) / stride[1] + 1,
        groups,
    };
    if (g.spatial() * g.per_group().0 * 4) as u64 > CONV_MAX_SAMPLE_COLS_BYTES {
        return None;
    }
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let wa = w.try_into_primitive::<Ad>().ok()?;
    let nodes = [xa.node(), wa.node()];
    let xf = contiguous(xa.into_primitive());
    let wf = contiguous(wa.into_primitive());
    let wm = values(&wf);
    let spc = g.samples_per_chunk();
    let spatial = g.spatial();
    // Every element is written: by the product, or by the chunks' transposition.
    let mut out = uninit(b * co * spatial);
    if let ConvCpuPath::PerSample { pointwise } = g.path() {
        // Each sample's planes: W [C_out, k] x its taps [k, OH·OW].
        out.par_chunks_mut(co * spatial)
            .zip(values(&xf).par_chunks(g.image()))
            .for_each_init(
                || Scratch::new(&g),
                |s, (out, image)| {
                    let cols = g.taps(pointwise, image, s);
                    gemm_into(
                        co,
                        spatial,
                        g.k(),
                        Strided::new(out, spatial, 1),
                        false,
                        Strided::new(wm, g.k(), 1),
                        Strided::new(cols, spatial, 1),
                    );
                },
            );
    } else {
        out.par_chunks_mut(spc * co * spatial)
            .zip(values(&xf).par_chunks(spc * g.image()))
            .for_each_init(
                || Scratch::new(&g),
                |s, (out, images)| {
                    let r = images.len() / g.image() * spatial;
                    // Group j: its rows times its filters, into its output channels.
                    let (kg, cog) = g.per_group();
                    for j in 0..g.groups {
                        g.im2col(images, j, &mut s.cols[..r * kg], &mut s.padded);
                        gemm_into(
                            r,
                            cog,
                            kg,
                            Strided::new(&mut s.rows[j * cog..r * co], co, 1),
                            false,
                            Strided::new(&s.cols[..r * kg], kg, 1),
                            Strided::new(&wm[j * cog * kg..], 1, kg),
                        );
                    }
                    // Rows (sample, position) x channel back to NCHW.
                    for (sample, rows) in s.rows[..r * co].chunks_exact(spatial * co).enumerate() {
                        let out = &mut out[sample * co * spatial..(sample + 1) * co * spatial];
                        for (pos, row) in rows.chunks_exact(co).enumerate() {
                            for (ch, &v) in row.iter().enumerate() {
                                out[ch * spatial + pos].write(v);
                            }
                        }
                    }
                },
            );
    }
    // SAFETY: see `out`.
    let out = unsafe { assume_init(out) };
    let y = from_vec(out, &[b, co, g.oh, g.ow], &FlexDevice::default());
    let state = || ConvState { g, x: xf, w: wf };
    Some(finish_op(ConvOp, nodes, state, y))
}

#[derive(Clone, Debug)]
struct ConvState {
    g: Geometry,
    /// The input and the weight, shared handles (no copies).
    x: FlexT,
    w: FlexT,
}

#[derive(Debug)]
struct ConvOp;

impl Backward<Flex, 2> for ConvOp {
    type State = ConvState;

    fn backward(self, ops: Ops<ConvState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ConvState { g, x, w } = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [x_node, w_node] = &ops.parents;
        let ids = [x_node, w_node].map(|n| n.as_ref().map(|n| n.id));
        let (spatial, co) = (g.spatial(), g.co);
        let (kg, cog) = g.per_group();
        let spc = g.samples_per_chunk();
        let wm = values(&w);
        let want_dx = x_node.is_some();
        let want_dw = w_node.is_some();
        // Every element is written (col2im, fold, or the pointwise product).
        let mut dx = uninit(if want_dx { g.b * g.image() } else { 0 });
        if let ConvCpuPath::PerSample { pointwise } = g.path() {
            let dw =
                backward_per_sample(&g, pointwise, values(&dy), values(&x), wm, want_dw, &mut dx);
            register(&g, grads, ids, dx, dw);
            return;
        }
        let mut dx_chunks: Vec<Option<&mut [MaybeUninit<f32>]>> = if want_dx {
            dx.chunks_mut(spc * g.image()).map(Some).collect()
        } else {
            (0..g.b.div_ceil(spc)).map(|_| None).collect()
        };
        let chunks = dx_chunks.len();
        let dw = values(&dy)
            .par_chunks(spc * co * spatial)
            .zip(values(&x).par_chunks(spc * g.image()))
            .zip(dx_chunks.par_iter_mut())
            .with_min_len(one_piece_per_thread(chunks))
            .fold(
                || (Scratch::new(&g), Vec::new()),
                |(mut s, mut dw), ((dy, images), dx)| {
                    let r = images.len() / g.image() * spatial;
                    // dY as rows (sample, position) x channel.
                    for (sample, planes) in dy.chunks_exact(co * spatial).enumerate() {
                        let rows = &mut s.rows[sample * spatial * co..(sample + 1) * spatial * co];
                        for (ch, plane) in planes.chunks_exact(spatial).enumerate() {
                            for (pos, &v) in plane.iter().enumerate() {
                                rows[pos * co + ch] = v;
                            }
                        }
                    }
                    let rows = &s.rows[..r * co];
                    if want_dw && dw.is_empty() {
                        dw = vec![0.0f32; co * kg];
                    }
                    for j in 0..g.groups {
                        if want_dw {
                            g.im2col(images, j, &mut s.cols[..r * kg], &mut s.padded);
                            // One weight gradient per thread, each chunk's product added to it.
                            gemm_into(
                                cog,
                                kg,
                                r,
                                Strided::new(&mut dw[j * cog * kg..], kg, 1),
                                true,
                                Strided::new(&rows[j * cog..], 1, co),
                                Strided::new(&s.cols[..r * kg], kg, 1),
                            );
                        }
                        if let Some(dx) = dx.as_deref_mut() {
                            gemm_into(
                                r,
                                kg,
                                cog,
                                Strided::new(&mut s.cols[..r * kg], kg, 1),
                                false,
                                Strided::new(&rows[j * cog..], co, 1),
                                Strided::new(&wm[j * cog * kg..], kg, 1),
                            );
                            // Leaves the padded scratch zeroed, as the next im2col needs.
                            g.col2im(&s.cols[..r * kg], j, dx, &mut s.padded);
                        }
                    }
                    (s, dw)
                },
            )
            .map(|(_, dw)| dw)
            .reduce_with(add_partials)
            .unwrap_or_default();
        drop(dx_chunks);
        register(&g, grads, ids, dx, dw);
    }
}

/// Registers the input's and the weight's gradients with the parents that want them.
fn register(
    g: &Geometry,
    grads: &mut Gradients,
    [x_node, w_node]: [Option<burn_autodiff::NodeId>; 2],
    dx: Vec<MaybeUninit<f32>>,
    dw: Vec<f32>,
) {
    let device = FlexDevice::default();
    if let Some(id) = x_node {
        // SAFETY: the backward wrote every element of dx when the input wants it.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(id, from_vec(dx, &[g.b, g.c, g.h, g.w], &device));
    }
    if let Some(id) = w_node {
        let shape = [g.co, g.c / g.groups, g.kh, g.kw];
        grads.register::<Flex>(id, from_vec(dw, &shape, &device));
    }
}

/// The per-sample path's backward (ungrouped): per sample, the weight gradient
/// `dY [C_out, OH·OW] x colsᵀ` added into one sum per thread, and the input's through the
/// taps' gradient `Wᵀ x dY` (folded back onto the windows; for a pointwise convolution it
/// is dx itself). `dx` is empty when the input wants no gradient. Returns the weight
/// gradient (empty when it is not wanted).
fn backward_per_sample(
    g: &Geometry,
    pointwise: bool,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    want_dw: bool,
    dx: &mut [MaybeUninit<f32>],
) -> Vec<f32> {
    let (spatial, co, k) = (g.spatial(), g.co, g.k());
    let mut dx_samples: Vec<Option<&mut [MaybeUninit<f32>]>> = if dx.is_empty() {
        (0..g.b).map(|_| None).collect()
    } else {
        dx.chunks_mut(g.image()).map(Some).collect()
    };
    dy.par_chunks(co * spatial)
        .zip(x.par_chunks(g.image()))
        .zip(dx_samples.par_iter_mut())
        .with_min_len(one_piece_per_thread(g.b))
        .fold(
            || (Scratch::new(g), Vec::new()),
            |(mut s, mut dw), ((dy, image), dx)| {
                if want_dw {
                    if dw.is_empty() {
                        dw = vec![0.0f32; co * k];
                    }
                    let cols = g.taps(pointwise, image, &mut s);
                    gemm_into(
                        co,
                        k,
                        spatial,
                        Strided::new(&mut dw, k, 1),
                        true,
                        Strided::new(dy, spatial, 1),
                        Strided::new(cols, 1, spatial),
                    );
                }
                if let Some(dx) = dx.as_deref_mut() {
                    let wt = Strided::new(w, 1, k);
                    let dy = Strided::new(dy, spatial, 1);
                    if pointwise {
                        gemm_into(k, spatial, co, Strided::new(dx, spatial, 1), false, wt, dy);
                    } else {
                        let dcols = Strided::new(&mut s.cols[..], spatial, 1);
                        gemm_into(k, spatial, co, dcols, false, wt, dy);
                        g.fold(&s.cols, dx, &mut s.padded);
                    }
                }
                (s, dw)
            },
        )
        .map(|(_, dw)| dw)
        .reduce_with(add_partials)
        .unwrap_or_default()
}

/// Rows (one channel of one sample) per rayon job of [`channel_bias_cpu`], at least one.
fn bias_rows_per_job(s: usize) -> usize {
    ((1 << 14) / s.max(1)).max(1)
}

/// `y` `[B, C, S]` plus `bias[c]` on channel c, written over y when nothing else holds it
/// (a convolution's fresh output); `None` off the CPU. burn's broadcast add and its
/// backward's `sum_dim`s are serial passes: 5 % of squeezenet1_1's step at batch 32.
/// The backward passes dy on as y's gradient (no copy) and sums it per channel in
/// parallel; nothing is kept.
pub fn channel_bias_cpu(y: Tensor<3>, bias: Tensor<1>) -> Option<Tensor<3>> {
    let [b, c, s] = y.dims();
    let ya = y.try_into_primitive::<Ad>().ok()?;
    let ba = bias.try_into_primitive::<Ad>().ok()?;
    let nodes = [ya.node(), ba.node()];
    let bf = contiguous(ba.into_primitive());
    let bv = values(&bf);
    let mut yf = contiguous(ya.into_primitive());
    if !yf.is_unique() {
        yf = from_vec(values(&yf).to_vec(), &[b, c, s], &FlexDevice::default());
    }
    let rows = bias_rows_per_job(s);
    crate::cpu::tensor::values_mut(&mut yf)
        .par_chunks_mut(rows * s.max(1))
        .enumerate()
        .for_each(|(job, chunk)| {
            for (r, row) in chunk.chunks_mut(s.max(1)).enumerate() {
                let add = bv[(job * rows + r) % c];
                row.iter_mut().for_each(|v| *v += add);
            }
        });
    Some(finish_op(ChannelBiasOp, nodes, || [b, c, s], yf))
}

#[derive(Debug)]
struct ChannelBiasOp;

impl Backward<Flex, 2> for ChannelBiasOp {
    /// The output's `[B, C, S]`.
    type State = [usize; 3];

    fn backward(self, ops: Ops<[usize; 3], 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [_, c, s] = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [y_node, bias_node] = &ops.parents;
        if let Some(node) = bias_node {
            // Each row's sum (in f64), then each channel's rows added.
            let rows = bias_rows_per_job(s);
            let row_sums: Vec<Vec<f64>> = values(&dy)
                .par_chunks(rows * s.max(1))
                .map(|chunk| {
                    let row_sum = |row: &[f32]| row.iter().map(|&v| f64::from(v)).sum();
                    chunk.chunks(s.max(1)).map(row_sum).collect()
                })
                .collect();
            let mut db = vec![0.0f64; c];
            for (r, v) in row_sums.iter().flatten().enumerate() {
                db[r % c] += v;
            }
            let db = db.into_iter().map(|v| v as f32).collect();
            grads.register::<Flex>(node.id, from_vec(db, &[c], &FlexDevice::default()));
        }
        if let Some(node) = y_node {
            grads.register::<Flex>(node.id, dy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::{Device, Distribution};

    /// Output and both gradients against burn's broadcast add, on a fresh output (written
    /// over) and a held one, rows shorter and longer than a job.
    #[test]
    fn channel_bias_matches_burn_add() {
        let device = Device::flex().autodiff();
        device.seed(6);
        for [b, c, s] in [[3, 4, 5], [2, 3, 20000], [5, 7, 1]] {
            let x = Tensor::<3>::random([b, c, s], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let bias =
                Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let r = Tensor::<3>::random([b, c, s], Distribution::Normal(0.0, 1.0), &device);
            // Each side its own graph: burn's tape is consumed by a backward.
            let want = || x.clone() * 2.0 + bias.clone().reshape([1, c, 1]);
            for got in [
                channel_bias_cpu(x.clone() * 2.0, bias.clone()),
                channel_bias_cpu(x.clone(), bias.clone()).map(|y| y + x.clone()),
            ] {
                let got = got.expect("a CPU tensor");
                assert!(max_rel_err(got.clone(), want()) < 1e-6, "[{b}, {c}, {s}]");
                let g_got = (got * r.clone()).sum().backward();
                let g_want = (want() * r.clone()).sum().backward();
                let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
                assert!(max_rel_err(dx(&g_got), dx(&g_want)) < 1e-6);
                let db = |g: &burn::tensor::Gradients| bias.grad(g).expect("bias gradient");
                assert!(max_rel_err(db(&g_got), db(&g_want)) < 1e-4);
            }
        }
    }

    /// Output, input and weight gradients against burn's convolution: strides,
    /// asymmetric padding, a rectangular kernel, a batch that leaves a short last chunk;
    /// every path.
    #[test]
    fn matches_burn_conv_and_its_gradients() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let cases = [
            ([3, 4, 7, 6], [5, 4, 3, 2], [1, 2], [(1, 0), (2, 1)]),
            ([2, 6, 5, 5], [3, 6, 3, 3], [2, 2], [(1, 1), (1, 1)]),
            // 1x1 output positions: many samples per chunk, a short last one.
            ([700, 3, 3, 3], [4, 3, 3, 3], [1, 1], [(0, 0), (0, 0)]),
            ([4, 3, 1, 10], [2, 3, 1, 3], [1, 2], [(0, 0), (1, 2)]),
            // Two groups; depthwise (a group per channel), strided.
            ([3, 4, 6, 5], [6, 2, 3, 3], [1, 1], [(1, 1), (1, 1)]),
            ([5, 6, 7, 7], [6, 1, 3, 3], [2, 2], [(1, 1), (1, 1)]),
            // One product per sample: pointwise, and a strided 1x1 that unfolds.
            ([3, 5, 4, 6], [7, 5, 1, 1], [1, 1], [(0, 0), (0, 0)]),
            ([2, 3, 8, 8], [4, 3, 1, 1], [2, 2], [(0, 0), (0, 0)]),
        ];
        let mut paths = Vec::new();
        for (xd, wd, stride, pads) in cases {
            let groups = xd[1] / wd[1];
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device).require_grad();
            let w = Tensor::<4>::random(wd, Distribution::Normal(0.0, 1.0), &device).require_grad();
            let opts = ConvOptions::new_with_padding(stride, pads, [1, 1], groups);
            let want = conv2d(x.clone(), w.clone(), None, opts);
            let got = conv2d_cpu(x.clone(), w.clone(), stride, pads, groups).expect("a CPU tensor");
            assert_eq!(got.dims(), want.dims());
            let [_, _, oh, ow] = got.dims();
            let pointwise = wd[2..] == [1, 1] && stride == [1, 1] && pads == [(0, 0); 2];
            paths.push(conv_cpu_path(oh * ow, groups, pointwise));
            assert!(max_rel_err(got.clone(), want.clone()) < 1e-4);
            let r = Tensor::<4>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
            let g_want = (want * r.clone()).sum().backward();
            let g_got = (got * r).sum().backward();
            let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
            assert!(max_rel_err(dx(&g_got), dx(&g_want)) < 1e-4, "{xd:?}");
            let dw = |g: &burn::tensor::Gradients| w.grad(g).expect("weight gradient");
            assert!(max_rel_err(dw(&g_got), dw(&g_want)) < 1e-4, "{xd:?}");
        }
        for path in [
            ConvCpuPath::Chunks,
            ConvCpuPath::PerSample { pointwise: true },
            ConvCpuPath::PerSample { pointwise: false },
        ] {
            assert!(paths.contains(&path), "no case runs {path:?}");
        }
    }
}
