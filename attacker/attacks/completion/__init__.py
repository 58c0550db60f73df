"""Model completion (Fu et al.): the plug-in, its training engine (MixMatch) and its report section."""
