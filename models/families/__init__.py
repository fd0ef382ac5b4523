"""The model families, one folder each (``models.registry`` lists them and says what a folder holds).
Importing a family's package imports its descriptor and configs only: no JAX."""
