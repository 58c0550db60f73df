"""Feature reconstruction from the activations the label party received: inversion, back-mapping,
GRN and CAFE, their scores and their report section."""
