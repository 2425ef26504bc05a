"""A batch's time: the limits every job of it keeps (``limits``), when the batch is ready for its
trainer and what becomes of the rest (``ready``), and how long its tail was (``tail``)."""
