"""Binders: how a decided placement becomes real (``base.Binder``)."""
