//! cuDNN's backend API through cudarc's `cudnn` sys layer.
