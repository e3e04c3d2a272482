// Compresses a sub-entry batch's bytes as the RabbitMQ stream Java client's codecs do
// (com.rabbitmq.stream.compression.CompressionUtils): its default factory's xerial Snappy
// framed stream, lz4-java's LZ4 frame (64 KiB blocks, independent) and zstd-jni's stream, and
// its Commons Compress factory's framed Snappy and framed LZ4. The libraries are the ones
// pyspark ships in its jars directory (the test puts them on the class path).
//
// java -cp 'JARS/*' SubEntryCodecs.java PLAIN_FILE...
// writes PLAIN_FILE.<codec> for each plain file and each codec below.
import com.github.luben.zstd.ZstdOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Paths;
import net.jpountz.lz4.LZ4FrameOutputStream;
import org.apache.commons.compress.compressors.lz4.FramedLZ4CompressorOutputStream;
import org.apache.commons.compress.compressors.snappy.FramedSnappyCompressorOutputStream;
import org.xerial.snappy.SnappyFramedOutputStream;

public class SubEntryCodecs {
  interface Codec {
    OutputStream wrap(OutputStream out) throws Exception;
  }

  static void write(String name, Codec codec, byte[] plain, String prefix) throws Exception {
    ByteArrayOutputStream buffer = new ByteArrayOutputStream();
    try (OutputStream out = codec.wrap(buffer)) {
      out.write(plain);
    }
    Files.write(Paths.get(prefix + "." + name), buffer.toByteArray());
  }

  public static void main(String[] args) throws Exception {
    for (String prefix : args) {
      byte[] plain = Files.readAllBytes(Paths.get(prefix));
      write("xerial-snappy", SnappyFramedOutputStream::new, plain, prefix);
      write("lz4-java", out -> new LZ4FrameOutputStream(out, LZ4FrameOutputStream.BLOCKSIZE.SIZE_64KB,
          new LZ4FrameOutputStream.FLG.Bits[] {LZ4FrameOutputStream.FLG.Bits.BLOCK_INDEPENDENCE}), plain, prefix);
      write("zstd-jni", ZstdOutputStream::new, plain, prefix);
      write("commons-snappy", FramedSnappyCompressorOutputStream::new, plain, prefix);
      write("commons-lz4", FramedLZ4CompressorOutputStream::new, plain, prefix);
    }
  }
}
